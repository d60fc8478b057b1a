"""The cyclic garbage collector, told what is here to stay.

A platform process holds some 150,000 objects tracked by Python's cyclic garbage collector once
Django, DRF, Celery and Channels are imported and the apps are ready: modules, classes, settings,
URL patterns, model metadata. Every full collection walks all of them. Under the API's load the
web process ran one every two seconds or so, each holding the GIL for 150 to 240 ms: every request
in flight waited, and that was the API's p99 (bench/README.md, "The garbage collector's pauses").

`freeze_startup_objects` moves what is alive now into the collector's permanent generation, which
no collection walks again (https://docs.python.org/3/library/gc.html#gc.freeze). Called once the
process is ready, before it serves: the web process at the end of `taskplatform.asgi`, a Celery
worker's main process before it forks each pool process (so the children share those pages
instead of copying them when a collection would write to them).
"""

from __future__ import annotations

import gc

# The web process's thresholds (Python's defaults are 700, 10, 10). A request allocates a few
# thousand objects, and a few hundred of them (DRF's bound fields, the request and its view) are
# cycles that only the collector frees; at the defaults the requests in flight were promoted and
# walked again and again. Measured, with the startup objects frozen, under the API load (8
# clients): 243 and 254 requests/s with p99 80 and 70 ms, against 200 and 288 requests/s with
# p99 110 and 69 ms at the defaults and 180 to 200 requests/s with p99 165 to 215 ms unfrozen.
WEB_THRESHOLDS = (20_000, 20, 20)


# While a process loads (its imports, Django's apps made ready) nearly every object it makes lives
# as long as the process, so a collection then walks them and frees next to nothing: at Python's
# default thresholds `django.setup()` ran some 260 young, 24 middle and 2 full collections, about
# 0.09 s of its 0.7 s of CPU, and freed 3,900 of 197,000 objects. So the collector is off from the
# platform's first import (`loading`) until Django's apps are ready (`loaded`, from the last
# installed app: taskplatform.apps), and what is alive then is frozen uncollected: those few
# thousand objects stay for the process's life, as the Python documentation's advice for a process
# that forks (gc.freeze) accepts. Every collection after that skips what was loaded.
_loading: dict[str, bool] = {}  # "collecting": the collector's state before `loading`; "done": `loaded` ran


def loading() -> None:
    """No collection until `loaded` (once per process: later calls change nothing)."""
    if not _loading:
        _loading["collecting"] = gc.isenabled()
        gc.disable()


def loaded() -> None:
    """What the process loaded out of later collections, and the collector as it was before `loading`."""
    if _loading and not _loading.get("done"):
        _loading["done"] = True
        gc.freeze()
        if _loading["collecting"]:
            gc.enable()


def freeze_startup_objects() -> None:
    """Collect what is garbage already, then keep every object alive now out of later collections."""
    gc.collect()
    gc.freeze()
