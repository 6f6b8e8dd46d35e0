"""Offline: the door for files, beside `callbacks` (the training loop's). `evaluate` reads token files and MCAP
recordings and scores them with `OWAEventMetrics`; `streaming` reads token files in blocks and shares them over the
ranks of ``torch.distributed``; `d2e` runs the D2E protocol on MCAP pairs and folders; `html_report` writes a
report's page. Import from the modules (nothing is gathered here, so that reading a file does not load matplotlib)."""
