"""Memory diagnostics for a benchmark's child processes (binder replicas): where does the RSS go?

Python imports `sitecustomize` at start-up from the first directory on sys.path that has one. A benchmark that
puts benchmarks/memdiag first on a child's PYTHONPATH and sets FRACGPU_MEMDIAG to a directory gets, every
FRACGPU_MEMDIAG_EVERY seconds (default 20), one JSON line per process in `<dir>/<pid>.jsonl`:

* `rss_mib`, `anon_mib` (/proc/self/status);
* glibc's own view (`mallinfo2`): bytes in its arenas (`arena_mib`: sbrk heap plus thread arenas), in mmapped
  blocks (`mmap_mib`), handed out (`used_mib`) and free but kept (`free_mib`, the fragmentation);
* with FRACGPU_MEMDIAG_TRACE=<frames>, tracemalloc: the bytes Python allocated and still holds (`traced_mib`),
  and the largest holders grouped by the innermost frame in this repository (`top`);
* counts of the gc-tracked objects by type (`types`, the 15 largest counts), and the binder's cache and queue
  sizes when a `BinderApp` can be found.

Nothing of this runs without FRACGPU_MEMDIAG: the binder never imports this file in production.
"""

from __future__ import annotations

import os

if os.environ.get("FRACGPU_MEMDIAG"):
    import collections
    import ctypes
    import gc
    import json
    import threading
    import time
    import tracemalloc

    _DIR = os.environ["FRACGPU_MEMDIAG"]
    _EVERY = float(os.environ.get("FRACGPU_MEMDIAG_EVERY", "20"))
    _FRAMES = int(os.environ.get("FRACGPU_MEMDIAG_TRACE", "0") or 0)
    _ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if _FRAMES:
        tracemalloc.start(_FRAMES)

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    def _mallinfo() -> dict:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _MallInfo2
            info = libc.mallinfo2()
        except (OSError, AttributeError):
            return {}
        mib = 1 << 20
        return {"arena_mib": round(info.arena / mib, 1), "mmap_mib": round(info.hblkhd / mib, 1),
                "used_mib": round(info.uordblks / mib, 1), "free_mib": round(info.fordblks / mib, 1)}

    def _status() -> dict:
        out = {}
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    out["rss_mib" if key == "VmRSS" else "anon_mib"] = round(int(value.split()[0]) / 1024, 1)
        return out

    def _holder(trace: tracemalloc.Trace) -> str:
        frames = list(trace.traceback)
        for frame in reversed(frames):  # most recent last: the innermost frame of ours
            if frame.filename.startswith(_ROOT) and "/memdiag/" not in frame.filename:
                return f"{os.path.relpath(frame.filename, _ROOT)}:{frame.lineno}"
        frame = frames[-1]
        return f"{frame.filename}:{frame.lineno}"

    def _binder_sizes() -> dict:
        for obj in gc.get_objects():
            if type(obj).__name__ == "BinderApp" and type(obj).__module__ == "binder.app":
                app = obj
                break
        else:
            return {}
        out = {"pods": len(app.caches.pods), "bindrequests": len(app.caches.bindrequests),
               "nodes": len(app.caches.nodes), "queue": app.queue.pending(), "group_queue": app.group_queue.pending(),
               "reports": app.reporter.pending(), "events_queued": app.record_event._queue.qsize(),
               "first_seen": len(app.controller._first_seen), "undecided": len(app.controller.undecided),
               "threads": threading.active_count()}
        for name, queue in (("queue", app.queue), ("group_queue", app.group_queue)):
            out[f"{name}_backoff"] = len(queue.backoff._failures)
            out[f"{name}_added_at"] = len(queue._added_at)
        return out

    def _sample(started: float) -> dict:
        record = {"t": round(time.monotonic() - started, 1), **_status(), **_mallinfo()}
        try:
            record["binder"] = _binder_sizes()
        except Exception as error:  # noqa: BLE001 - a diagnostic never takes the process down
            record["binder"] = {"error": repr(error)}
        types = collections.Counter(type(o).__name__ for o in gc.get_objects())
        record["types"] = dict(types.most_common(15))
        if _FRAMES:
            snapshot = tracemalloc.take_snapshot()
            sizes: collections.Counter[str] = collections.Counter()
            for trace in snapshot.traces:
                sizes[_holder(trace)] += trace.size
            record["traced_mib"] = round(sum(sizes.values()) / (1 << 20), 1)
            record["top"] = {k: round(v / (1 << 20), 2) for k, v in sizes.most_common(25)}
        return record

    def _run() -> None:
        started = time.monotonic()
        path = os.path.join(_DIR, f"{os.getpid()}.jsonl")
        while True:
            time.sleep(_EVERY)
            try:
                line = json.dumps(_sample(started))
            except Exception as error:  # noqa: BLE001
                line = json.dumps({"error": repr(error)})
            with open(path, "a") as out:
                out.write(line + "\n")

    threading.Thread(target=_run, name="memdiag", daemon=True).start()
