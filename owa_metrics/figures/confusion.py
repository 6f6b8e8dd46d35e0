"""The category confusion matrix as a figure, and a figure as PNG bytes."""

from __future__ import annotations

import numpy as np

from ..schema import CATEGORY_NAMES


def png_of(figure) -> bytes:
    """A figure (made without pyplot, so that nothing holds it) as PNG bytes: rendered once for every logger and
    file."""
    import io

    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def confusion_figure(confusion, title: str):
    """The target x predicted category matrix, coloured by the share of the target row, each cell's count and
    share written in black or white to contrast with it; 320 x 260 px, 7.5 pt text: TensorBoard shows it whole in
    an image card (its Images tab draws it at this size, its Time Series tab scales it to the card)."""
    from matplotlib.figure import Figure

    counts = confusion.cpu().double().numpy()
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    fig = Figure(figsize=(3.2, 2.6), dpi=100)
    ax = fig.subplots()
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(CATEGORY_NAMES) + 1), [*CATEGORY_NAMES, "invalid"], fontsize=7.5, rotation=25,
                  ha="right", rotation_mode="anchor")
    ax.set_yticks(range(len(CATEGORY_NAMES)), CATEGORY_NAMES, fontsize=7.5)
    ax.tick_params(length=2, pad=1)
    ax.set_xlabel("predicted (colour: share of the target row)", fontsize=7.5, labelpad=2)
    ax.set_ylabel("target", fontsize=7.5, labelpad=1)
    ax.set_title(title, fontsize=8, fontweight="bold", pad=4)
    for (i, j), count in np.ndenumerate(counts):
        text = f"{count:,.0f}" if count < 10_000 else f"{count / 1000:,.0f}k"
        ax.text(j, i, f"{text}\n{share[i, j]:.0%}", ha="center", va="center", fontsize=7, linespacing=1.1,
                color="white" if share[i, j] > 0.5 else "black")
    fig.tight_layout(pad=0.3)
    return fig
