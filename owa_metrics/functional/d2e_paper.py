"""The D2E paper's published figures for its Generalist-IDM (G-IDM), as data: what `owa-metrics evaluate --bin-ms 50`
prints beside a user's ``d2e/...`` keys, and what docs/METRICS.md tabulates (a test holds the two equal).

The G-IDM (NEP-τ, τ = 100 ms) on the six games of its evaluation: one row per game from the paper's Tables 4 and 5
(printed there in %, Pearson and accuracies; here as ratios, the keys' unit), and the row of Table 18 at τ = 100 ms,
the mean over the six. Measured with the protocol's defaults: 50 ms bins, empty bins not counted.
"""

from __future__ import annotations

from .d2e import DEFAULT_BIN_MS

SOURCE = ("D2E (Choi et al., ICLR 2026), arXiv 2510.05684v2: G-IDM, τ = 100 ms; per game Tables 4-5, "
          "their mean Table 18 (read through a public reproduction's table of them; docs/METRICS.md)")
BIN_MS = DEFAULT_BIN_MS  # the protocol the figures were measured with (50 ms bins), empty_bins_as_correct False
KEYS = ("mouse_move/pearson_x", "mouse_move/pearson_y", "mouse_move/scale_ratio_x", "mouse_move/scale_ratio_y",
        "keyboard/key_accuracy", "mouse_button/button_accuracy")  # the columns of the rows, as d2e/ keys
PER_GAME = (  # game, then `KEYS`
    ("Brotato", 0.7365, 0.8203, 1.37, 1.29, 0.8636, 0.9850),
    ("Stardew Valley", 0.8298, 0.7557, 1.13, 1.17, 0.7435, 0.9643),
    ("Core Keeper", 0.7725, 0.6455, 1.43, 1.51, 0.7000, 0.9401),
    ("Apex Legends", 0.8390, 0.8527, 1.13, 1.23, 0.7655, 0.9967),
    ("GTA V", 0.7944, 0.8389, 1.09, 1.42, 0.6983, 0.9411),
    ("Minecraft", 0.8029, 0.7838, 1.24, 1.27, 0.6097, 0.9165),
)
MEAN = ("mean of the 6 games", 0.796, 0.783, 1.23, 1.31, 0.730, 0.957)  # Table 18, τ = 100 ms

