"""One colour per model across every figure, and the words for each summary.

A model's colour depends on its name only: the views and methods of this
package have fixed colours, any other name hashes to a colour of the same
colour-blind-safe palette. :func:`model_colors` resolves clashes inside one
figure without looking at the order of the names.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

# Okabe & Ito (2008) without its yellow (too light on white), then three of
# Paul Tol's "muted" colours that stay apart from them.
PALETTE: tuple[str, ...] = (
    "#0072b2",  # blue
    "#d55e00",  # vermillion
    "#009e73",  # bluish green
    "#cc79a7",  # reddish purple
    "#e69f00",  # orange
    "#56b4e9",  # sky blue
    "#000000",  # black
    "#882255",  # wine
    "#999933",  # olive
    "#332288",  # indigo
)

# A method shares the colour of the model it deploys (FedAvg: the global model,
# Ditto: the personal ones, LINDT: the dual one).
_KNOWN: dict[str, int] = {
    "global": 0, "fedavg": 0,
    "personal": 1, "ditto": 1,
    "local": 2,
    "finetuned": 3, "finetune": 3, "onestep": 3,
    "dual": 4, "lindt": 4,
    "term": 5, "interpolated": 5,
    "private": 6,
    "mocha": 7,
    "fedprox": 8,
    "fedplus": 9, "fed+": 9,
}

_OWNER = {i: n for n, i in reversed(_KNOWN.items())}  # the first name of a colour
_WORD = re.compile(r"[\s,;:()\[\]/=]+")


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9+]", "", word.lower())


def _known(name: str) -> int | None:
    whole = _norm(name)
    if whole in _KNOWN:
        return _KNOWN[whole]
    words = [w for w in _WORD.split(name.strip()) if w]
    return _KNOWN.get(_norm(words[0])) if words else None


def _hashed(name: str) -> int:
    return zlib.crc32(_norm(name).encode() or name.encode()) % len(PALETTE)


def model_color(name: str) -> str:
    """The colour of a model, method or curve name, the same in every figure.

    ``'global'``/``'fedavg'``, ``'personal'``/``'ditto'``, ``'local'``,
    ``'finetuned'``, ``'dual'``/``'lindt'``, ``'term'``, ``'private'``,
    ``'mocha'``, ``'fedprox'``, ``'fedplus'`` have fixed colours; case and
    punctuation are ignored (``'FedAvg'``, ``'Fed-Avg'``), and a name whose
    first word is one of them takes its colour (``'Ditto, lam = 1'``). Any
    other name gets a colour of :data:`PALETTE` chosen by a hash of the name.

    Args:
      name: the name.

    Returns:
      A ``'#rrggbb'`` colour from :data:`PALETTE`.
    """
    i = _known(str(name))
    return PALETTE[_hashed(str(name)) if i is None else i]


def model_colors(names: Iterable[str]) -> dict[str, str]:
    """:func:`model_color` of several names that appear in one figure.

    Distinct names that would share a colour are told apart: a view keeps its
    colour (``'global'`` before ``'fedavg'``), then a name that is exactly a
    known one (``'FedAvg'`` before ``'FedAvg + median'``), else the first in
    sorted order; each of the rest takes its hashed colour or, if that
    is used in the figure too, the next free colour of :data:`PALETTE`. The
    result depends on the set of names, never on their order.

    Args:
      names: the names (repeats allowed).

    Returns:
      name -> ``'#rrggbb'``.
    """
    names = sorted({str(n) for n in names})
    first = {n: model_color(n) for n in names}

    def rank(n):  # a colour's first name ('global'), other known names, the rest
        i = _KNOWN.get(_norm(n))
        return (2 if i is None else int(_OWNER[i] != _norm(n)), n)

    out: dict[str, str] = {}
    for n in sorted(names, key=rank):
        c = first[n]
        if c in out.values():
            used = set(out.values()) | {first[m] for m in names if m not in out}
            start = _hashed(n)  # the name's own hashed colour, or the next free
            free = [PALETTE[(start + k) % len(PALETTE)] for k in range(len(PALETTE))]
            c = next((f for f in free if f not in used), c)
        out[n] = c
    return out


# The summaries evaluate() writes under '{view}/{split}/{metric}/{summary}'.
_SUMMARY_STYLE = {"mean": "-", "mean_unweighted": "-.", "worst10": "--",
                  "best10": ":", "std": "-", "var": "-", "psi": "-"}


def summary_words(summary: str, split: str) -> str:
    """How a summary of the per-client values is computed, in words."""
    return {
        "mean": f"mean weighted by {split} examples",
        "mean_unweighted": "unweighted mean over clients",
        "worst10": "worst 10 % of clients, unweighted mean",
        "best10": "best 10 % of clients, unweighted mean",
        "std": "std across clients",
        "var": "variance across clients",
        "psi": r"$\Psi$: variance weighted by train examples",
    }.get(summary, summary)


def parse_key(key: str) -> tuple[str, str, str, str] | None:
    """``(view, split, metric, summary)`` of a history key, else None."""
    parts = key.split("/")
    if len(parts) == 4 and parts[3] in _SUMMARY_STYLE and all(parts):
        return parts[0], parts[1], parts[2], parts[3]
    return None


def summary_style(summary: str | None) -> str:
    return _SUMMARY_STYLE.get(summary, "-")
