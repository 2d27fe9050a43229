"""Getting the next batch ready while the device works on this one (lesson 03).

- `to_device(batch, device, non_blocking=True)`: move every tensor of a batch (tuple, list,
  dict or tensor) to a device.
- `CudaPrefetcher(loader, device)`: the apex `data_prefetcher` idea. On CUDA it copies the
  *next* batch to the GPU on a side stream while the current one trains; the consumer's stream
  waits for the copy (`wait_stream`) before using it, and `record_stream` tells the caching
  allocator the tensors are used on the consumer's stream, so their memory is not handed out
  again while that stream may still read it. On the CPU the same code runs with stand-in
  streams (`course_utils.accel`); beside the simulator the batches pass through.
- `BackgroundLoader(loader, max_prefetch=2)`: like prefetch_generator's `BackgroundGenerator`:
  a thread pulls batches from `loader` into a small queue, so loading the next batch overlaps
  with the main thread waiting for the device. Optionally pins each batch, or applies a
  function to it, in that thread.

Both are plain iterables of batches: pass them to `course_utils.train.train` as the loader.
Both can be iterated again (each `for` starts a new pass over `loader`) and end cleanly.
"""
from __future__ import annotations

import queue
import threading
import time

import torch

from .accel import current_stream, new_stream, pin, pinning_helps, record_stream, use_stream

__all__ = ["to_device", "CudaPrefetcher", "BackgroundLoader"]


def to_device(batch, device, non_blocking: bool = True):
    """Move every tensor in `batch` (a tensor, or a tuple/list/dict of them) to `device`.

    With `non_blocking=True` a copy from pinned host memory is queued and returns at once;
    from ordinary (pageable) memory it is synchronous whatever the flag says. Lesson 03.
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):       # a namedtuple
        return type(batch)(*(to_device(b, device, non_blocking) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


_END = object()


class CudaPrefetcher:
    """Copy the next batch to the GPU on a side stream while the current batch trains (lesson 03).

        for images, labels in CudaPrefetcher(loader, device):   # already on the device
            ...

    For the copy to overlap, the loader's tensors must be in pinned memory
    (`DataLoader(..., pin_memory=True)`). On the CPU the same code runs with `course_utils.accel`'s
    stand-ins for streams (COURSE_DEVICE=cpu exercises it); beside the simulated accelerator the
    batches pass through unchanged. `stream` is the side stream (None until the first pass starts).
    """

    def __init__(self, loader, device):
        self.loader = loader
        self.device = device if getattr(device, "type", None) == "sim" else torch.device(device)
        self.stream = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        if self.device.type == "sim":          # the simulator shares host memory: nothing to copy
            yield from self.loader
            return
        if self.stream is None:
            self.stream = new_stream(self.device)  # a CUDA stream; on the CPU a HostStream stand-in
        stream = self.stream
        batches = iter(self.loader)

        def preload():
            try:
                batch = next(batches)
            except StopIteration:
                return _END
            with use_stream(stream):                   # the copy is queued on the side stream
                return to_device(batch, self.device, non_blocking=True)

        upcoming = preload()
        while upcoming is not _END:
            consumer = current_stream(self.device)
            consumer.wait_stream(stream)               # the consumer waits for the copy to finish
            batch = upcoming
            record_stream(batch, consumer)             # memory stays reserved while the consumer uses it
            upcoming = preload()                       # start copying the next batch now
            yield batch

    def __repr__(self) -> str:
        return f"CudaPrefetcher({self.loader!r}, device={self.device})"


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class BackgroundLoader:
    """Load batches in a background thread, up to `max_prefetch` ahead (lesson 03).

        for images, labels in BackgroundLoader(loader):
            ...

    The thread runs `iter(loader)` and puts each batch in a queue of size `max_prefetch`; the
    consumer takes them out. Work that releases the GIL (tensor ops, file reads, waiting on
    DataLoader workers, waiting on the device) overlaps; pure-Python work does not.
    Options, done in the thread: `pin_memory=True` pins each batch (only when CUDA is
    available), and `transform` is applied to each batch: `transform(images, labels)` for an
    `(images, labels)` batch (the signature of `train`'s `batch_transform`), else
    `transform(batch)`. An exception in the
    thread is raised in the consumer; stopping early (a `break`) stops the thread.
    The thread first makes the consumer's current CUDA device its own (a new thread starts on
    device 0: pinning there, or a DataLoader's pin thread started there, would put a CUDA context
    of every rank on GPU 0; pytorch#58626).
    """

    def __init__(self, loader, max_prefetch: int = 2, *, pin_memory: bool = False, transform=None):
        if max_prefetch < 1:
            raise ValueError("max_prefetch must be >= 1")
        self.loader = loader
        self.max_prefetch = int(max_prefetch)
        self.pin_memory = bool(pin_memory) and pinning_helps()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        q: queue.Queue = queue.Queue(maxsize=self.max_prefetch)
        stop = threading.Event()
        device = torch.cuda.current_device() if torch.cuda.is_available() else None   # the consumer's
        thread = threading.Thread(target=self._produce, args=(q, stop, device), name="background-loader",
                                  daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            stop.set()
            while thread.is_alive():          # unblock a producer waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.05)

    def _produce(self, q: queue.Queue, stop: threading.Event, device: int | None = None) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            if device is not None:
                torch.cuda.set_device(device)   # before anything here (pinning, iter(loader)) touches CUDA
            for batch in self.loader:
                if stop.is_set():
                    return
                if self.pin_memory:
                    batch = pin(batch)
                if self.transform is not None:
                    batch = self.transform(*batch) if isinstance(batch, (tuple, list)) else self.transform(batch)
                if not put(batch):
                    return
                # Yield the GIL once: the consumer (and, beside the simulator, the device
                # thread) just got a batch and wants to run; without this the thread's next
                # burst of short tensor ops keeps winning the GIL back and delays them.
                time.sleep(0)
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Failure(exc))
            return
        put(_END)

    def __repr__(self) -> str:
        return f"BackgroundLoader({self.loader!r}, max_prefetch={self.max_prefetch})"
