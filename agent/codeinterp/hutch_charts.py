"""A matplotlib figure as E2B's chart object.

chart_of(figure) describes what a figure draws, as data: its type (line,
scatter, bar, pie, box_and_whisker; superchart for a figure of several
axes, unknown for anything else), its title, axis labels, units, ticks and
scales, and its elements (the lines' points, the bars' values, the
wedges' angles, the boxes' quartiles). startup.py calls it for every
figure the kernel displays. Box plots are read from the statistics
Axes.bxp drew them from, which startup.py records on the axes.
"""

import datetime
import math
import re

from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle, Wedge, PathPatch
from matplotlib.text import Text

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _num(v):
    """A JSON value for a coordinate: floats rounded, dates in ISO form."""
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    try:
        import numpy
        if isinstance(v, numpy.datetime64):
            return str(v.astype("datetime64[s]"))
        if isinstance(v, numpy.generic):
            v = v.item()
    except ImportError:
        pass
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return None
        return float("%.10g" % v)
    return str(v)


def _kind_of_converter(axis):
    conv = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
    name = type(conv).__name__ if conv is not None else ""
    if "Date" in name:
        return "datetime"
    if "StrCategory" in name:
        return "categorical"
    return None


def _grid_line(line):
    return line.get_gid() == "grid" or (line.get_label() or "").startswith("_grid")


def _texts(labels):
    return [t.get_text() for t in labels]


def _axis2d(ax, out):
    out["x_label"] = ax.get_xlabel() or None
    out["y_label"] = ax.get_ylabel() or None
    for k in ("x", "y"):
        lbl = out[k + "_label"]
        m = _UNIT.search(lbl) if lbl else None
        out[k + "_unit"] = (m.group(1) or m.group(2)) if m else None


def _ticks(ax, out):
    if not any(_texts(ax.get_xticklabels())):
        ax.figure.canvas.draw()
    for k, axis, ticks, labels, scale in (
        ("x", ax.xaxis, ax.get_xticks(), ax.get_xticklabels(), ax.get_xscale()),
        ("y", ax.yaxis, ax.get_yticks(), ax.get_yticklabels(), ax.get_yscale()),
    ):
        kind = _kind_of_converter(axis)
        if kind == "datetime":
            from matplotlib.dates import num2date
            out[k + "_ticks"] = [num2date(t).isoformat() for t in ticks]
        else:
            out[k + "_ticks"] = [_num(t) for t in ticks]
        out[k + "_tick_labels"] = _texts(labels)
        out[k + "_scale"] = kind or scale


def _type_of(ax):
    if getattr(ax, "_hutch_boxes", None):
        return "box_and_whisker"
    arts = [a for a in ax.get_children() if a in ax.lines or a in ax.collections or a in ax.patches]
    arts = [a for a in arts if not isinstance(a, Text) and not (isinstance(a, Line2D) and _grid_line(a))]
    if not arts:
        return "unknown"
    if all(isinstance(a, Line2D) for a in arts):
        return "line"
    if all(isinstance(a, PathCollection) for a in arts):
        return "scatter"
    if all(isinstance(a, Wedge) for a in arts):
        return "pie"
    if all(isinstance(a, Rectangle) for a in arts) and any(isinstance(c, BarContainer) for c in ax.containers):
        return "bar"
    if all(isinstance(a, (PathPatch, Line2D)) for a in arts):
        return "box_and_whisker"
    return "unknown"


def _line(ax, out):
    _axis2d(ax, out)
    _ticks(ax, out)
    n = 0
    for line in ax.get_lines():
        if _grid_line(line):
            continue
        label = line.get_label()
        if label.startswith("_"):
            label = "Line %d" % n
        n += 1
        out["elements"].append({"label": label, "points": [[_num(x), _num(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]})


def _scatter(ax, out):
    _axis2d(ax, out)
    _ticks(ax, out)
    for i, c in enumerate(ax.collections):
        label = c.get_label()
        if label.startswith("_"):
            label = "Series %d" % i
        out["elements"].append({"label": label, "points": [[_num(x), _num(y)] for x, y in c.get_offsets()]})


def _category(ax, axis, pos):
    """The tick label at position pos of axis ("x" or "y"), else pos."""
    ticks = ax.get_xticks() if axis == "x" else ax.get_yticks()
    labels = _texts(ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())
    for t, l in zip(ticks, labels):
        if abs(t - pos) < 1e-9 and l:
            return l
    return str(_num(pos))


def _bar(ax, out):
    _axis2d(ax, out)
    if not any(_texts(ax.get_xticklabels())):
        ax.figure.canvas.draw()
    horizontal = False
    for i, c in enumerate(ax.containers):
        if not isinstance(c, BarContainer):
            continue
        horizontal = getattr(c, "orientation", "vertical") == "horizontal"
        group = c.get_label()
        if not group or group.startswith("_"):
            group = "Group %d" % i
        for r in c.patches:
            if horizontal:
                label, value = _category(ax, "y", r.get_y() + r.get_height() / 2), r.get_width()
            else:
                label, value = _category(ax, "x", r.get_x() + r.get_width() / 2), r.get_height()
            out["elements"].append({"label": label, "group": group, "value": _num(value)})
    if horizontal:
        for a, b in (("x_label", "y_label"), ("x_unit", "y_unit")):
            out[a], out[b] = out[b], out[a]


def _pie(ax, out):
    for w in ax.patches:
        if isinstance(w, Wedge):
            out["elements"].append({"label": w.get_label(), "angle": round(abs(w.theta2 - w.theta1), 3), "radius": _num(w.r)})


def _box(ax, out):
    _axis2d(ax, out)
    boxes = getattr(ax, "_hutch_boxes", None) or []
    if any(not vert for _, vert in boxes):
        for a, b in (("x_label", "y_label"), ("x_unit", "y_unit")):
            out[a], out[b] = out[b], out[a]
    for stats, vert in boxes:
        for i, s in enumerate(stats):
            out["elements"].append({
                "label": str(s.get("label", i + 1)),
                "min": _num(s["whislo"]), "first_quartile": _num(s["q1"]), "median": _num(s["med"]),
                "third_quartile": _num(s["q3"]), "max": _num(s["whishi"]),
                "outliers": [_num(v) for v in s.get("fliers", [])],
            })


_KINDS = {"line": _line, "scatter": _scatter, "bar": _bar, "pie": _pie, "box_and_whisker": _box}


def chart_of_axes(ax: Axes):
    kind = _type_of(ax)
    out = {"type": kind, "title": ax.get_title() or None, "elements": []}
    if kind in _KINDS:
        _KINDS[kind](ax, out)
    return out


def chart_of(figure):
    """The chart of figure, or None if it draws no data."""
    axes = [ax for ax in figure.get_axes() if ax.has_data()]
    if not axes:
        return None
    if len(axes) == 1:
        return chart_of_axes(axes[0])
    title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else None
    return {"type": "superchart", "title": title, "elements": [chart_of_axes(ax) for ax in axes]}
