# hutch's code interpreter: run by every Python context's IPython kernel at
# start (IPython's profile_default/startup). It adds the formats E2B's
# results carry beside Jupyter's own: "e2b/data" (a pandas DataFrame as
# columns of values) and "e2b/chart" (a matplotlib figure as data,
# hutch_charts.py). Neither imports pandas or matplotlib: they act only on
# objects of modules the code already imported.
def __hutch_setup():
    import importlib.abc
    import importlib.util
    import math
    import os
    import sys

    import IPython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    here = os.environ.get("HUTCH_CODEINTERP_DIR", "/usr/local/lib/hutch/codeinterp")
    charts = []

    def chart_module():
        if not charts:
            spec = importlib.util.spec_from_file_location("hutch_charts", os.path.join(here, "hutch_charts.py"))
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            charts.append(m)
        return charts[0]

    def plain(v):
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if hasattr(v, "isoformat"):
            return v.isoformat()
        if hasattr(v, "item"):
            return plain(v.item())
        if v is None or isinstance(v, (str, int, float, bool)):
            return v
        return str(v)

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

        def __call__(self, obj):
            pd = sys.modules.get("pandas")
            if pd is not None and isinstance(obj, pd.DataFrame):
                return {str(k): [plain(v) for v in vs] for k, vs in obj.to_dict(orient="list").items()}
            return super().__call__(obj)

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            fig = sys.modules.get("matplotlib.figure")
            if fig is not None and isinstance(obj, fig.Figure):
                try:
                    return chart_module().chart_of(obj)
                except Exception:
                    return None
            return super().__call__(obj)

    ip = IPython.get_ipython()
    f = ip.display_formatter.formatters
    f["e2b/data"] = DataFormatter(parent=ip.display_formatter)
    f["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)

    # Box plots: record on the axes the statistics Axes.bxp draws, once
    # matplotlib.axes is imported, so that the chart carries them exactly.
    def patch_bxp(axes_module):
        Axes = axes_module.Axes
        if getattr(Axes.bxp, "__hutch__", False):
            return
        original = Axes.bxp

        def bxp(self, bxpstats, *args, **kwargs):
            vert = kwargs.get("vert", args[1] if len(args) > 1 else True)
            if vert is None:
                vert = True
            if kwargs.get("orientation") == "horizontal":
                vert = False
            stats = [dict(s) for s in bxpstats]
            labels = kwargs.get("labels")
            if labels is not None:
                for s, l in zip(stats, labels):
                    s["label"] = l
            r = original(self, bxpstats, *args, **kwargs)
            if not hasattr(self, "_hutch_boxes"):
                self._hutch_boxes = []
            self._hutch_boxes.append((stats, bool(vert)))
            return r

        bxp.__hutch__ = True
        Axes.bxp = bxp

    if "matplotlib.axes" in sys.modules:
        patch_bxp(sys.modules["matplotlib.axes"])
    else:
        class Finder(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "matplotlib.axes":
                    return None
                sys.meta_path.remove(self)
                try:
                    spec = importlib.util.find_spec(name)
                finally:
                    sys.meta_path.insert(0, self)
                if spec is None or spec.loader is None:
                    return spec
                loader = spec.loader
                exec_module = loader.exec_module

                def patched(module):
                    exec_module(module)
                    try:
                        patch_bxp(module)
                    finally:
                        if self in sys.meta_path:
                            sys.meta_path.remove(self)

                loader.exec_module = patched
                return spec

        sys.meta_path.insert(0, Finder())


__hutch_setup()
del __hutch_setup
