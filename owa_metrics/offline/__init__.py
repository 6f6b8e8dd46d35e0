"""Offline: the door for files, beside `callbacks` (the training loop's). `evaluate` reads token files and MCAP
recordings and scores them with `OWAEventMetrics`; `streaming` reads token files in blocks and shares them over the
ranks of ``torch.distributed``; `d2e` runs the D2E protocol on MCAP pairs and folders; `html_report` writes a
report's page. Nothing is gathered here: ``offline.evaluate`` stays the module, its function is ``evaluate.evaluate``
(users import it from `owa_metrics.evaluate`)."""
