"""Callbacks: the event metrics in Lightning (`OWAEventMetricsCallback`) and transformers' Trainer."""

from .hf import OWAEventMetricsForTrainer
from .lightning import OWAEventMetricsCallback

__all__ = ["OWAEventMetricsCallback", "OWAEventMetricsForTrainer"]
