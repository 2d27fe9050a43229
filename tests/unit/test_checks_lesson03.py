"""Lesson 03's checks, proven: right answers pass, stubs are 'not implemented', and every mutant
(a plausible wrong answer: the lesson's warnings, CPU-right-GPU-wrong code, wrappers of the
course's own implementation, slightly-off statistics, wasteful code) fails on its property on
every seed. The GPU-only mistakes are caught on the virtual CUDA device, so they fail here too."""
import pytest
import torch
import torch.nn.functional as F

from course_utils.checks import run_check
from course_utils.data import CIFAR10_MEAN, CIFAR10_STD
from mutants import Mutant, passes, rejected

SEEDS = range(6)          # the checks take a fraction of a second each


# -- 3.1 ------------------------------------------------------------------------------------------

class GoodPrefetcher:
    def __init__(self, loader, device):
        self.loader, self.device = loader, torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def copy(self, batch):
        images, labels = batch
        with torch.cuda.stream(self.stream):
            return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def hand_out(self, batch):
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_stream(self.stream)
        for t in batch:
            t.record_stream(consumer)
        return batch

    def __iter__(self):
        if self.stream is None:
            for images, labels in self.loader:
                yield images.to(self.device), labels.to(self.device)
            return
        batches = iter(self.loader)
        upcoming = next(batches, None)
        upcoming = self.copy(upcoming) if upcoming is not None else None
        while upcoming is not None:
            batch = self.hand_out(upcoming)
            following = next(batches, None)
            upcoming = self.copy(following) if following is not None else None
            yield batch


class EndsWithNone(GoodPrefetcher):          # the apex idiom: next() returns None at the end
    def __iter__(self):
        yield from super().__iter__()
        yield None


class DropsTheLast(GoodPrefetcher):          # forgets the batch still pending when the loader runs out
    def __iter__(self):
        batches = iter(self.loader)
        pending = next(batches, None)
        for batch in batches:
            yield tuple(t.to(self.device) for t in pending)
            pending = batch


class ListsTheLoader(GoodPrefetcher):
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.batches = [(x.to(device), y.to(device)) for x, y in loader]

    def __iter__(self):
        return iter(self.batches)


class OneShot:                                 # an iterator, not an iterable: empty on the second pass
    def __init__(self, loader, device):
        self.it, self.device = iter(loader), device

    def __iter__(self):
        return self

    def __next__(self):
        images, labels = next(self.it)
        return images.to(self.device), labels.to(self.device)


class IteratorMadeInInit(GoodPrefetcher):    # apex's data_prefetcher: iter(loader) and the first copy in __init__
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.batches = iter(loader)
        self.preload()

    def preload(self):
        following = next(self.batches, None)
        if following is None or self.stream is None:
            self.upcoming = None if following is None else tuple(t.to(self.device) for t in following)
        else:
            self.upcoming = self.copy(following)

    def __iter__(self):
        while self.upcoming is not None:
            batch = self.upcoming if self.stream is None else self.hand_out(self.upcoming)
            self.preload()
            yield batch


class YieldsImagesOnly(GoodPrefetcher):
    def __iter__(self):
        for images, _ in super().__iter__():
            yield images


class NoWaitStream(GoodPrefetcher):          # right on a CPU; on a GPU reads the batch before it arrived
    def hand_out(self, batch):
        for t in batch:
            t.record_stream(torch.cuda.current_stream(self.device))
        return batch


class NoRecordStream(GoodPrefetcher):        # the allocator may reuse the batch's memory too early
    def hand_out(self, batch):
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return batch


class RecordOnSideStream(GoodPrefetcher):
    def hand_out(self, batch):
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        for t in batch:
            t.record_stream(self.stream)
        return batch


class WaitsTheWrongWay(GoodPrefetcher):      # the side stream waits for the consumer
    def hand_out(self, batch):
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        for t in batch:
            t.record_stream(torch.cuda.current_stream(self.device))
        return batch


class WaitsForTheDefaultStream(GoodPrefetcher):   # right while the loop runs on the default stream only
    def hand_out(self, batch):
        consumer = torch.cuda.default_stream(self.device)
        consumer.wait_stream(self.stream)
        for t in batch:
            t.record_stream(consumer)
        return batch


class CopiesOnTheCurrentStream(GoodPrefetcher):
    def copy(self, batch):
        images, labels = batch
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


class BlockingCopy(GoodPrefetcher):
    def copy(self, batch):
        images, labels = batch
        with torch.cuda.stream(self.stream):
            return images.to(self.device), labels.to(self.device)


class SynchronizesTheHost(GoodPrefetcher):   # right values, but the host stops for every batch
    def hand_out(self, batch):
        self.stream.synchronize()
        for t in batch:
            t.record_stream(torch.cuda.current_stream(self.device))
        return batch


class NoPrefetch(GoodPrefetcher):            # copies each batch only when it is asked for
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        for batch in self.loader:
            yield self.hand_out(self.copy(batch))


class LeavesBatchesOnTheHost(GoodPrefetcher):   # "the loader pinned them already"
    def __iter__(self):
        for images, labels in self.loader:
            yield images, labels


class LabelsStayOnTheHost(GoodPrefetcher):
    def copy(self, batch):
        images, labels = batch
        with torch.cuda.stream(self.stream):
            return images.to(self.device, non_blocking=True), labels

    def hand_out(self, batch):
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_stream(self.stream)
        batch[0].record_stream(consumer)
        return batch


class WaitsOnceUpFront(GoodPrefetcher):      # waits before the loop, when nothing has been copied yet
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_stream(self.stream)
        batches = iter(self.loader)
        upcoming = next(batches, None)
        upcoming = self.copy(upcoming) if upcoming is not None else None
        while upcoming is not None:
            for t in upcoming:
                t.record_stream(consumer)
            batch, following = upcoming, next(batches, None)
            upcoming = self.copy(following) if following is not None else None
            yield batch


def wraps_the_course_prefetcher():
    from course_utils.prefetch import CudaPrefetcher

    class Prefetcher(CudaPrefetcher):
        pass
    return Prefetcher


class PrefetchStub:
    def __init__(self, loader, device):
        raise NotImplementedError("Exercise 3.1")

    def __iter__(self):
        raise NotImplementedError("Exercise 3.1")


MUTANTS_31 = [
    Mutant("yields None at the end", EndsWithNone, "ends cleanly"),
    Mutant("drops the last batch", DropsTheLast, "yields every batch"),
    Mutant("lists the loader", ListsTheLoader, "reads the loader as it goes"),
    Mutant("an iterator, not an iterable", OneShot, "starts a new pass over the loader each time it is iterated"),
    Mutant("the loader's iterator made once, in __init__", IteratorMadeInInit,
           "starts a new pass over the loader each time it is iterated", words="in __init__"),
    Mutant("yields images only", YieldsImagesOnly, "yields (images, labels) pairs"),
    Mutant("forgets wait_stream", NoWaitStream, "the consumer waits for the copy"),
    Mutant("forgets record_stream", NoRecordStream, "keeps a batch's memory for the consumer's stream (record_stream)"),
    Mutant("record_stream on the side stream", RecordOnSideStream, "keeps a batch's memory for the consumer's stream (record_stream)"),
    Mutant("waits the wrong way round", WaitsTheWrongWay, "the consumer waits for the copy"),
    Mutant("waits for the default stream", WaitsForTheDefaultStream, "the consumer waits for the copy"),
    Mutant("copies on the current stream", CopiesOnTheCurrentStream, "copies on a side stream"),
    Mutant("blocking copies", BlockingCopy, "copies asynchronously"),
    Mutant("synchronizes the host", SynchronizesTheHost, "never makes the host wait"),
    Mutant("no prefetch", NoPrefetch, "copies the next batch before handing out this one"),
    Mutant("leaves batches on the host", LeavesBatchesOnTheHost, "puts the tensors on the device"),
    Mutant("labels stay on the host", LabelsStayOnTheHost, "puts the tensors on the device"),
    Mutant("waits once up front", WaitsOnceUpFront, "the consumer waits for the copy"),
    Mutant("wraps the course's CudaPrefetcher", wraps_the_course_prefetcher(), "is your own code"),
]


def test_3_1_right_answers_pass():
    passes("3.1", GoodPrefetcher, SEEDS)


@pytest.mark.parametrize("mutant", MUTANTS_31, ids=repr)
def test_3_1_mutants_rejected(mutant):
    rejected("3.1", mutant, SEEDS)


def test_3_1_the_course_prefetcher_is_still_right_outside_the_check():
    from course_utils.prefetch import CudaPrefetcher
    loader = [(torch.ones(2, 3), torch.zeros(2))]
    assert [x.shape for x, _ in CudaPrefetcher(loader, "cpu")] == [torch.Size([2, 3])]


def test_3_1_stub_and_wrong_type():
    assert run_check("3.1", PrefetchStub).status == "not_implemented"
    result = run_check("3.1", GoodPrefetcher(range(3), "cpu"))
    assert result.status == "fail" and "a class" in result.message


# -- issue 37: the learner's walk (w1-03) and the expert's review (x-03), their exact answers ------

class YieldsInsideTheStreamContext(GoodPrefetcher):   # w1-03 M28: the loop's whole step runs on the side stream
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        batches = iter(self.loader)
        with torch.cuda.stream(self.stream):
            following = next(batches, None)
            upcoming = None if following is None else tuple(t.to(self.device, non_blocking=True) for t in following)
            while upcoming is not None:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_stream(self.stream)
                for t in upcoming:
                    t.record_stream(consumer)
                current = upcoming
                following = next(batches, None)
                upcoming = None if following is None else tuple(t.to(self.device, non_blocking=True) for t in following)
                yield current


class StateOnTheInstance(GoodPrefetcher):     # w1-03 M41: a `break` leaves the old pass behind for the next one
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.it = self.upcoming = None

    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        if self.it is None:
            self.it = iter(self.loader)
            following = next(self.it, None)
            self.upcoming = None if following is None else self.copy(following)
        while self.upcoming is not None:
            batch = self.hand_out(self.upcoming)
            following = next(self.it, None)
            self.upcoming = None if following is None else self.copy(following)
            yield batch
        self.it = None


class WaitsAfterTheNextCopy(GoodPrefetcher):   # w1-03 M11: step k also waits for batch k+1's copy
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        batches = iter(self.loader)
        following = next(batches, None)
        upcoming = None if following is None else self.copy(following)
        while upcoming is not None:
            current = upcoming
            following = next(batches, None)
            upcoming = None if following is None else self.copy(following)
            yield self.hand_out(current)


class KeepsEveryBatch(GoodPrefetcher):         # w1-03 M40: device memory grows by an epoch
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.seen = []

    def __iter__(self):
        for batch in super().__iter__():
            self.seen.append(batch)
            yield batch


class PinsAgain(GoodPrefetcher):               # w1-03 M21: a host copy into new pinned memory every batch
    def copy(self, batch):
        with torch.cuda.stream(self.stream):
            return tuple(t.clone().pin_memory().to(self.device, non_blocking=True) for t in batch)


class FloatOnTheHost(GoodPrefetcher):          # w1-03 M19: converted on the host (pageable, 4x the bytes)
    def copy(self, batch):
        images, labels = batch
        with torch.cuda.stream(self.stream):
            return images.float().to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


class PageableClone(GoodPrefetcher):           # w1-03 M26: a copy from pageable memory stages on the host
    def copy(self, batch):
        with torch.cuda.stream(self.stream):
            return tuple(t.clone().to(self.device, non_blocking=True) for t in batch)


class PassesThroughOffCuda(GoodPrefetcher):    # w1-03 M15: right on the CPU only
    def __iter__(self):
        if self.stream is None:
            yield from self.loader
            return
        yield from super().__iter__()


class DeviceZero(GoodPrefetcher):              # w1-03 M20: "cuda:0" written into the code
    def copy(self, batch):
        with torch.cuda.stream(self.stream):
            return tuple(t.to("cuda:0", non_blocking=True) for t in batch)


class StreamWithoutDevice(GoodPrefetcher):     # w1-03 M29: torch.cuda.Stream() is the current device's
    def __init__(self, loader, device):
        super().__init__(loader, device)
        if self.stream is not None:
            self.stream = torch.cuda.Stream()


class CloneOnTheDevice(GoodPrefetcher):        # w1-03 M39: a device copy of every batch for nothing
    def copy(self, batch):
        with torch.cuda.stream(self.stream):
            return tuple(t.to(self.device, non_blocking=True).clone() for t in batch)


class ReusedPinnedStaging(GoodPrefetcher):     # x-03 X1: the host refills a buffer a queued copy still reads
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        buffers = {}
        batches = iter(self.loader)

        def stage(t):
            key = (tuple(t.shape), t.dtype)
            if key not in buffers:
                buffers[key] = torch.empty(t.shape, dtype=t.dtype).pin_memory()
            buffers[key].copy_(t)
            return buffers[key]

        def copy_next():
            following = next(batches, None)
            if following is None:
                return None
            with torch.cuda.stream(self.stream):
                return tuple(stage(t).to(self.device, non_blocking=True) for t in following)

        upcoming = copy_next()
        while upcoming is not None:
            batch, upcoming = self.hand_out(upcoming), copy_next()
            yield batch


class RecordsOnTheSideStream(RecordOnSideStream):   # w1-03 M9's message: record_stream on the wrong stream
    pass


class DropsTheFirst(GoodPrefetcher):           # w1-03 M23: the first batch fetched, then fetched over
    def __iter__(self):
        batches = iter(self.loader)
        next(batches, None)
        if self.stream is None:
            for images, labels in batches:
                yield images.to(self.device), labels.to(self.device)
            return
        following = next(batches, None)
        upcoming = None if following is None else self.copy(following)
        while upcoming is not None:
            batch = self.hand_out(upcoming)
            following = next(batches, None)
            upcoming = None if following is None else self.copy(following)
            yield batch


class UnguardedNext(GoodPrefetcher):           # w1-03 M18: next() without a default in a generator
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        batches = iter(self.loader)
        upcoming = self.copy(next(batches))
        while upcoming is not None:
            batch = self.hand_out(upcoming)
            following = next(batches, None)
            upcoming = None if following is None else self.copy(following)
            yield batch


# right answers the reports list (GPU-right): they must pass
class EventAfterTheCopy(GoodPrefetcher):       # w1-03 M36, x-03 X2: the consumer waits for an event
    def copy(self, batch):                     # the event travels with its batch (not on self: two passes at once)
        out = super().copy(batch)
        event = torch.cuda.Event()
        event.record(self.stream)
        return out, event

    def hand_out(self, batch):
        batch, event = batch
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for t in batch:
            t.record_stream(consumer)
        return batch


class AllocatedOnTheConsumer(GoodPrefetcher):  # x-03 X3: no record_stream, a wait back instead (torch's preferred)
    def copy(self, batch):
        consumer = torch.cuda.current_stream(self.device)
        dst = tuple(torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in batch)
        self.stream.wait_stream(consumer)
        with torch.cuda.stream(self.stream):
            for d, t in zip(dst, batch):
                d.copy_(t, non_blocking=True)
        return dst

    def hand_out(self, batch):
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return batch


class CopiesFromAThread(GoodPrefetcher):       # x-03 X4: a helper thread issues the copies, one ahead
    def __iter__(self):
        import queue
        import threading
        if self.stream is None:
            yield from super().__iter__()
            return
        batches = iter(self.loader)
        requests, results = queue.Queue(), queue.Queue()

        def worker():
            while requests.get():
                following = next(batches, None)
                if following is None:
                    results.put(None)
                    return
                with torch.cuda.stream(self.stream):
                    out = tuple(t.to(self.device, non_blocking=True) for t in following)
                    event = torch.cuda.Event()
                    event.record(self.stream)
                results.put((out, event))

        threading.Thread(target=worker, daemon=True).start()
        requests.put(True)
        try:
            while True:
                item = results.get()
                if item is None:
                    return
                batch, event = item
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_event(event)
                for t in batch:
                    t.record_stream(consumer)
                requests.put(True)
                yield batch
        finally:
            requests.put(False)


class WaitsBackBeforeEachCopy(GoodPrefetcher):   # x-03 X6: the side stream also waits for the consumer
    def copy(self, batch):
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return super().copy(batch)


class RecordsThenWaits(GoodPrefetcher):        # w1-03 M33: the order of the two calls does not matter
    def hand_out(self, batch):
        consumer = torch.cuda.current_stream(self.device)
        for t in batch:
            t.record_stream(consumer)
        consumer.wait_stream(self.stream)
        return batch


class NewStreamEveryBatch(GoodPrefetcher):     # w1-03 M34: on self, rejected since w10-03 (zip(p, p) replaces it)
    def copy(self, batch):
        self.stream = torch.cuda.Stream(self.device)
        return super().copy(batch)


MUTANTS_31_WALKED = [
    Mutant("yields inside the stream context", YieldsInsideTheStreamContext,
           "hands each batch to the training loop on the loop's own stream", words="yields inside"),
    Mutant("state kept on the instance across a break", StateOnTheInstance,
           "starts a new pass over the loader each time it is iterated", words="went on with the pass that was stopped"),
    Mutant("waits after queuing the next copy", WaitsAfterTheNextCopy, "waits for this batch's copy only",
           words="waited for batch 1's copy too"),
    Mutant("keeps every batch", KeepsEveryBatch, "keeps no batch the training loop is done with"),
    Mutant("pins every batch again", PinsAgain, "pins nothing in the training loop"),
    Mutant("float32 on the host", FloatOnTheHost, "yields the loader's batches unchanged", words="torch.uint8"),
    Mutant("copies a pageable clone", PageableClone, "copies from the loader's pinned memory", words="pageable"),
    Mutant("passes batches through unmoved off CUDA", PassesThroughOffCuda,
           "moves the batches to any device that is not CUDA", words="meta"),
    Mutant("\"cuda:0\" written in", DeviceZero, "uses the device it is given", words="cuda:0"),
    Mutant("a stream made without the device", StreamWithoutDevice, "copies on a side stream",
           words="your side stream is on cuda:0"),
    Mutant("clones the batch on the device", CloneOnTheDevice, "launches nothing on the device but the copies",
           words="aten.clone"),
    Mutant("one pinned staging buffer, refilled", ReusedPinnedStaging,
           "leaves pinned memory alone while a copy from it is queued", words="still copying"),
    Mutant("record_stream for the side stream", RecordsOnTheSideStream,
           "keeps a batch's memory for the consumer's stream (record_stream)", words="your side stream"),
    Mutant("skips the first batch", DropsTheFirst, "yields every batch", words="the first was skipped"),
    Mutant("next() without a default in the generator", UnguardedNext, "ends cleanly", words="PEP 479"),
]


class KeepsTheLastBatch(GoodPrefetcher):      # w2-03 w31_23: `self.last = batch` "for debugging"
    def __iter__(self):
        for batch in super().__iter__():
            self.last = batch
            yield batch


class AsksTheMachineNotTheDevice(GoodPrefetcher):   # w2-03 w31_24: right on a machine without CUDA only
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.stream = torch.cuda.Stream(self.device) if torch.cuda.is_available() else None


class OnePinnedBufferPerShape(GoodPrefetcher):   # w2-03 w31_14: one pinned buffer, made anew when the shape changes
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        buf = None
        batches = iter(self.loader)

        def copy_next():
            nonlocal buf
            following = next(batches, None)
            if following is None:
                return None
            if buf is None or buf[0].shape != following[0].shape:
                buf = tuple(torch.empty_like(t).pin_memory() for t in following)
            for b, t in zip(buf, following):
                b.copy_(t)
            with torch.cuda.stream(self.stream):
                return tuple(b.to(self.device, non_blocking=True) for b in buf)

        upcoming = copy_next()
        while upcoming is not None:
            batch, upcoming = self.hand_out(upcoming), copy_next()
            yield batch


class PinsInThePrefetcher(GoodPrefetcher):     # w2-03 w31_12: pin_memory() of a pinned tensor is that tensor
    def copy(self, batch):
        with torch.cuda.stream(self.stream):
            return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in batch)


class ApexResetInIter(GoodPrefetcher):        # w2-03 w31_22: __iter__ resets the state on self and returns self
    def __iter__(self):
        if self.stream is None:
            return super().__iter__()
        self.it = iter(self.loader)
        self.upcoming = self._copy_next()
        return self

    def _copy_next(self):
        following = next(self.it, None)
        return None if following is None else self.copy(following)

    def __next__(self):
        if self.upcoming is None:
            raise StopIteration
        batch = self.hand_out(self.upcoming)
        self.upcoming = self._copy_next()
        return list(batch)                     # w31_19: a list, not a tuple


MUTANTS_31_WALKED += [
    Mutant("keeps the last batch on self", KeepsTheLastBatch, "keeps no batch the training loop is done with",
           words="after the pass had ended"),
    Mutant("torch.cuda.is_available() decides, not the device", AsksTheMachineNotTheDevice,
           "decides by the device it is given", words="self.device.type"),
    Mutant("pins the pinned batches again (w3-03 #16 too)", PinsInThePrefetcher, "pins nothing in the training loop",
           words="called pin_memory()"),
    Mutant("one pinned buffer, made anew when the shape changes", OnePinnedBufferPerShape,
           "leaves pinned memory alone while a copy from it is queued", words="still copying"),
]


def test_3_1_right_answers_of_the_reports_pass():
    for answer in (EventAfterTheCopy, AllocatedOnTheConsumer, CopiesFromAThread, WaitsBackBeforeEachCopy,
                   RecordsThenWaits):      # NewStreamEveryBatch (on self): rejected since w10-03, see there
        passes("3.1", answer, SEEDS[:2])


@pytest.mark.parametrize("mutant", MUTANTS_31_WALKED, ids=repr)
def test_3_1_walked_mutants_rejected(mutant):
    rejected("3.1", mutant, SEEDS)


# -- 3.2 ------------------------------------------------------------------------------------------

def _draws(n, padding, device, generator, high=None):
    high = 2 * padding + 1 if high is None else high
    dy = torch.randint(0, high, (n,), device=device, generator=generator)
    dx = torch.randint(0, high, (n,), device=device, generator=generator)
    flip = torch.rand(n, device=device, generator=generator) < 0.5
    return dy, dx, flip


def _crop_with(images, padding, dy, dx, flip, *, mode="constant", flip_dim=-1):
    """Batched crop (no Python loop): gather rows and columns of the padded batch."""
    if mode == "constant":
        padded = F.pad(images, (padding,) * 4)
    else:
        padded = F.pad(images.float(), (padding,) * 4, mode=mode).to(images.dtype)
    n, c, h, w = images.shape
    dev = images.device
    rows = torch.arange(h, device=dev) + dy[:, None]
    cols = torch.arange(w, device=dev) + dx[:, None]
    out = padded[torch.arange(n, device=dev)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    out = out.permute(0, 3, 1, 2)
    return torch.where(flip.view(-1, 1, 1, 1), out.flip(flip_dim), out).contiguous()


def crop_flip(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, flip)


def crop_flip_strided(images, padding=4, generator=None):
    """Also right: a strided view of every window, one gather (what course_utils does)."""
    n, c, h, w = images.shape
    k = 2 * padding + 1
    dy, dx, flip = _draws(n, padding, images.device, generator)
    padded = F.pad(images, (padding,) * 4)
    s = padded.stride()
    windows = padded.as_strided((n, k, k, c, h, w), (s[0], s[2], s[3], s[1], s[2], s[3]))
    crops = windows[torch.arange(n, device=images.device), dy, dx]
    return torch.where(flip.view(n, 1, 1, 1), crops.flip(3), crops)


def one_offset_for_the_batch(images, padding=4, generator=None):
    dy, dx, flip = _draws(1, padding, images.device, generator)
    n = len(images)
    return _crop_with(images, padding, dy.expand(n), dx.expand(n), flip.expand(n))


def exclusive_upper_bound(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator, high=2 * padding)
    return _crop_with(images, padding, dy, dx, flip)


def flips_height(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, flip, flip_dim=-2)


def reflect_padding(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, flip, mode="reflect")


def ignores_generator(images, padding=4, generator=None):
    return crop_flip(images, padding, None)


def flips_everything(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, torch.ones_like(flip))


def flips_45_percent(images, padding=4, generator=None):        # slightly off
    dy, dx, _ = _draws(len(images), padding, images.device, generator)
    flip = torch.rand(len(images), device=images.device, generator=generator) < 0.45
    return _crop_with(images, padding, dy, dx, flip)


def triangular_offsets(images, padding=4, generator=None):       # 0..2p, but not uniform
    n, dev = len(images), images.device
    dy = torch.randint(0, padding + 1, (n,), device=dev, generator=generator) + \
        torch.randint(0, padding + 1, (n,), device=dev, generator=generator)
    dx = torch.randint(0, padding + 1, (n,), device=dev, generator=generator) + \
        torch.randint(0, padding + 1, (n,), device=dev, generator=generator)
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    return _crop_with(images, padding, dy, dx, flip)


def same_offset_both_axes(images, padding=4, generator=None):
    dy, _, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dy, flip)


def returns_float(images, padding=4, generator=None):
    return crop_flip(images, padding, generator).float()


def draws_on_the_host(images, padding=4, generator=None):       # right on a CPU; a copy per batch on a GPU
    dy, dx, flip = _draws(len(images), padding, "cpu", None)
    return _crop_with(images, padding, dy.to(images.device), dx.to(images.device), flip.to(images.device))


def host_generator_then_copy(images, padding=4, generator=None):
    dy, dx, flip = _draws(len(images), padding, "cpu", generator)
    return _crop_with(images, padding, dy.to(images.device), dx.to(images.device), flip.to(images.device))


def arange_on_the_host(images, padding=4, generator=None):       # torch.arange(n) without a device
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    padded = F.pad(images, (padding,) * 4)
    rows = torch.arange(h) + dy[:, None]
    cols = torch.arange(w) + dx[:, None]
    out = padded[torch.arange(n)[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    return torch.where(flip.view(-1, 1, 1, 1), out.flip(-1), out).contiguous()


def python_loop(images, padding=4, generator=None):            # one slice per sample: reads every offset
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    padded = F.pad(images, (padding,) * 4)
    h, w = images.shape[-2:]
    out = torch.stack([padded[i, :, int(y):int(y) + h, int(x):int(x) + w] for i, (y, x) in enumerate(zip(dy, dx))])
    return torch.where(flip.view(-1, 1, 1, 1), out.flip(-1), out)


def python_loop_slicing_with_device_offsets(images, padding=4, generator=None):   # dy[i] is a 0-d device tensor
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    padded = F.pad(images, (padding,) * 4)
    h, w = images.shape[-2:]
    out = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(len(images))])
    return torch.where(flip.view(-1, 1, 1, 1), out.flip(-1), out)


def reseeds_the_generator(images, padding=4, generator=None):    # "reproducible": every call draws alike
    if generator is None:
        generator = torch.Generator(device=images.device)
    generator.manual_seed(0)
    return crop_flip(images, padding, generator)


def fixed_seed_when_none(images, padding=4, generator=None):     # a new generator, seed 0, on every call
    if generator is None:
        generator = torch.Generator(device=images.device).manual_seed(0)
    return crop_flip(images, padding, generator)


def reseeds_from_torch_when_none(images, padding=4, generator=None):
    if generator is None:
        generator = torch.Generator(device=images.device).manual_seed(torch.initial_seed())
    return crop_flip(images, padding, generator)


def default_padding_of_two(images, padding=2, generator=None):
    return crop_flip(images, padding, generator)


def round_trip_through_the_host(images, padding=4, generator=None):
    return crop_flip(images.cpu(), padding, None).to(images.device)


def materialises_every_window(images, padding=4, generator=None):   # 81 copies of the batch
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    windows = F.pad(images, (padding,) * 4).unfold(2, h, 1).unfold(3, w, 1).contiguous()   # (n, c, k, k, h, w)
    crops = windows[torch.arange(n, device=images.device), :, dy, dx]
    return torch.where(flip.view(n, 1, 1, 1), crops.flip(3), crops)


def identity_on_small_batches(images, padding=4, generator=None):   # right on the big batch the check counts
    if len(images) < 1000:
        return images.clone()
    return crop_flip(images, padding, generator)


def flips_every_other_sample(images, padding=4, generator=None):   # half the batch flipped, by position
    dy, dx, _ = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, torch.arange(len(images), device=images.device) % 2 == 0)


def flips_the_first_half(images, padding=4, generator=None):
    dy, dx, _ = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, dx, torch.arange(len(images), device=images.device) < len(images) // 2)


def one_flip_for_the_batch(images, padding=4, generator=None):      # one coin for the whole batch
    dy, dx, _ = _draws(len(images), padding, images.device, generator)
    coin = torch.rand(1, device=images.device, generator=generator) < 0.5
    return _crop_with(images, padding, dy, dx, coin.expand(len(images)))


def wraps_the_course(images, padding=4, generator=None):
    from course_utils.device_data import random_crop_flip
    return random_crop_flip(images, padding, generator)


def crop_stub(images, padding=4, generator=None):
    raise NotImplementedError("Exercise 3.2")


MUTANTS_32 = [
    Mutant("one offset for the batch", one_offset_for_the_batch, "offsets vary across samples, uniformly"),
    Mutant("exclusive upper bound", exclusive_upper_bound, "offsets cover the whole range"),
    Mutant("flips the height", flips_height, "every output is a crop of the padded input, mirrored or not"),
    Mutant("reflect padding", reflect_padding, "every output is a crop of the padded input, mirrored or not"),
    Mutant("ignores the generator", ignores_generator, "reproducible under a seed"),
    Mutant("flips everything", flips_everything, "flips half the samples"),
    Mutant("flips 45%", flips_45_percent, "flips half the samples"),
    Mutant("triangular offsets", triangular_offsets, "offsets vary across samples, uniformly"),
    Mutant("one offset for both axes", same_offset_both_axes, "draws the two offsets independently"),
    Mutant("returns float", returns_float, "keeps dtype and device"),
    Mutant("draws on the host, copies", draws_on_the_host, "makes no copy from the host"),
    Mutant("host generator, copies", host_generator_then_copy, "draws its random numbers on the images' device"),
    Mutant("arange on the host", arange_on_the_host, "keeps all its work on the device"),
    Mutant("a Python loop over samples", python_loop, "never waits for the device"),
    Mutant("round trip through the host", round_trip_through_the_host, "makes no copy from the host"),
    Mutant("materialises every window", materialises_every_window, "uses memory in proportion to the batch"),
    Mutant("identity on small batches", identity_on_small_batches, "augments every sample, at every position of the batch",
           words="not augmented as the others are"),   # found first by the per-position calls (w3-03)
    Mutant("a Python loop slicing with 0-d device tensors", python_loop_slicing_with_device_offsets,
           "never waits for the device", words="a device tensor used as an index or a slice bound"),
    Mutant("re-seeds the generator on every call", reseeds_the_generator, "draws new crops on every call"),
    Mutant("a generator seeded 0 when none is given", fixed_seed_when_none, "draws new crops on every call"),
    Mutant("a generator from torch.initial_seed() on every call", reseeds_from_torch_when_none,
           "draws new crops on every call"),
    Mutant("default padding 2", default_padding_of_two, "pads by 4 by default"),
    # issue 35's rule: half of the batch flipped, but not at random per sample
    Mutant("flips every other sample", flips_every_other_sample, "flips each sample independently, with probability 1/2"),
    Mutant("flips the first half", flips_the_first_half, "flips each sample independently, with probability 1/2"),
    Mutant("one flip for the whole batch", one_flip_for_the_batch, "flips half the samples"),
    Mutant("wraps course_utils.device_data", wraps_the_course, "is your own code"),
]


def test_3_2_right_answers_pass():
    for fn in (crop_flip, crop_flip_strided):
        passes("3.2", fn, SEEDS[:3])


@pytest.mark.parametrize("mutant", MUTANTS_32, ids=repr)
def test_3_2_mutants_rejected(mutant):
    rejected("3.2", mutant, SEEDS[:3])


def test_3_2_stub_and_wrong_type():
    assert run_check("3.2", crop_stub).status == "not_implemented"
    assert run_check("3.2", torch.zeros(3)).status == "fail"


# -- issue 37: the learner's walk (w1-03) and the expert's review (x-03), their exact answers ------

def reuses_the_draw_for_the_flip(images, padding=4, generator=None):   # w1-03 M48: flip exactly when dx <= 4
    n, dev = len(images), images.device
    dy = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    r = torch.rand(n, device=dev, generator=generator)
    return _crop_with(images, padding, dy, (r * (2 * padding + 1)).long(), r < 0.5)


def dx_mirrors_dy(images, padding=4, generator=None):                  # w1-03 M50: dy == dx only 1/9 of the time
    dy, _, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images, padding, dy, 2 * padding - dy, flip)


def offsets_by_position(images, padding=4, generator=None):            # uniform, independent of dx, but a pattern
    n, dev = len(images), images.device
    _, dx, flip = _draws(n, padding, dev, generator)
    return _crop_with(images, padding, torch.arange(n, device=dev) % (2 * padding + 1), dx, flip)


def flips_by_a_fixed_random_pattern(images, padding=4, generator=None):  # random-looking, the same every call
    dy, dx, _ = _draws(len(images), padding, images.device, generator)
    fixed = torch.Generator(device=images.device).manual_seed(0)
    return _crop_with(images, padding, dy, dx, torch.rand(len(images), device=images.device, generator=fixed) < 0.5)


_BUFFER = {}


def reused_output_buffer(images, padding=4, generator=None):          # w1-03 M53: the next call overwrites it
    out = crop_flip(images, padding, generator)
    key = (tuple(out.shape), out.dtype, str(out.device))
    if key not in _BUFFER:
        _BUFFER[key] = torch.empty_like(out)
    _BUFFER[key].copy_(out)
    return _BUFFER[key]


def python_loop_with_device_indices(images, padding=4, generator=None):   # x-03 X20: no sync, 4 launches a sample
    n, c, h, w = images.shape
    dev = images.device
    dy, dx, flip = _draws(n, padding, dev, generator)
    padded = F.pad(images, (padding,) * 4)
    rows = dy[:, None] + torch.arange(h, device=dev)
    base = torch.arange(w, device=dev)
    cols = torch.where(flip[:, None], base.flip(0), base) + dx[:, None]
    out = []
    for i in range(n):
        sample = padded[i].index_select(1, rows[i]).index_select(2, cols[i])
        out.append(sample)
    return torch.stack(out)


def loop_over_the_offsets(images, padding=4, generator=None):          # x-03 X21: 81 offsets, launch after launch
    n, c, h, w = images.shape
    dev = images.device
    dy, dx, flip = _draws(n, padding, dev, generator)
    padded = F.pad(images, (padding,) * 4)
    out = torch.zeros_like(images)
    for y in range(2 * padding + 1):
        for x in range(2 * padding + 1):
            pick = ((dy == y) & (dx == x)).view(n, 1, 1, 1)
            out = torch.where(pick, padded[:, :, y:y + h, x:x + w], out)
    return torch.where(flip.view(n, 1, 1, 1), out.flip(-1), out)


def clamped_offsets(images, padding=4, generator=None):               # w1-03 M46: -p..p clamped at 0
    n, dev = len(images), images.device
    dy, _, flip = _draws(n, padding, dev, generator)
    dx = torch.randint(-padding, padding + 1, (n,), device=dev, generator=generator).clamp(min=0)
    return _crop_with(images, padding, dy, dx, flip)


def square_images_assumed(images, padding=4, generator=None):         # w1-03 M17: w used for the rows as well
    n, c, h, w = images.shape
    dev = images.device
    dy, dx, flip = _draws(n, padding, dev, generator)
    padded = F.pad(images, (padding,) * 4)
    rows = dy[:, None] + torch.arange(w, device=dev)
    base = torch.arange(w, device=dev)
    cols = torch.where(flip[:, None], base.flip(0), base) + dx[:, None]
    out = padded[torch.arange(n, device=dev)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


# right answers the reports list: they must pass (GPU-right)
def where_with_python_numbers(images, padding=4, generator=None):     # w1-03: torch.where(flip, -1, 1)
    n, c, h, w = images.shape
    dev = images.device
    dy, dx, flip = _draws(n, padding, dev, generator)
    padded = F.pad(images, (padding,) * 4)
    step, start = torch.where(flip, -1, 1), torch.where(flip, w - 1, 0)
    cols = dx[:, None] + start[:, None] + step[:, None] * torch.arange(w, device=dev)
    rows = dy[:, None] + torch.arange(h, device=dev)
    out = padded[torch.arange(n, device=dev)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


def bernoulli_flips(images, padding=4, generator=None):               # x-03 X23: torch.bernoulli with the generator
    n, dev = len(images), images.device
    dy, dx, _ = _draws(n, padding, dev, generator)
    flip = torch.bernoulli(torch.full((n,), 0.5, device=dev), generator=generator).bool()
    return _crop_with(images, padding, dy, dx, flip)


def grid_sample_nearest(images, padding=4, generator=None):          # w1-03 M26/M47: exact with nearest sampling
    n, c, h, w = images.shape
    dev = images.device
    dy, dx, flip = _draws(n, padding, dev, generator)
    theta = torch.zeros(n, 2, 3, device=dev)
    theta[:, 0, 0] = torch.where(flip, -1.0, 1.0)
    theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = (dx - padding).float() * 2 / w
    theta[:, 1, 2] = (dy - padding).float() * 2 / h
    grid = F.affine_grid(theta, (n, c, h, w), align_corners=False)
    out = F.grid_sample(images.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.round().to(images.dtype)


def one_draw_for_both_offsets(images, padding=4, generator=None):   # w1-03 M23: one randint of shape (2, n)
    n = len(images)
    d = torch.randint(0, 2 * padding + 1, (2, n), device=images.device, generator=generator)
    flip = torch.randint(0, 2, (n,), device=images.device, generator=generator).bool()
    return _crop_with(images, padding, d[0], d[1], flip)


MUTANTS_32_WALKED = [
    Mutant("one draw for dx and the flip", reuses_the_draw_for_the_flip, "draws the flips independently of the offsets"),
    Mutant("dx mirrors dy", dx_mirrors_dy, "draws the two offsets independently", words="81 combinations"),
    Mutant("offsets by position", offsets_by_position, "draws each sample independently of the others"),
    Mutant("a fixed pattern of flips", flips_by_a_fixed_random_pattern, "draws new crops on every call",
           words="the same flip"),
    Mutant("one output buffer, reused", reused_output_buffer, "returns a new tensor on every call"),
    Mutant("a Python loop over the samples, no sync", python_loop_with_device_indices,
           "runs the same operations for any batch size (no Python loop over the samples)"),
    Mutant("a loop over the offsets", loop_over_the_offsets, "runs a few operations per batch"),
    Mutant("offsets clamped at 0", clamped_offsets, "offsets cover the whole range", words="clamped"),
    Mutant("square images assumed", square_images_assumed, "IndexError", status="error", words="not square"),
]


def offsets_for_padding_four_only(images, padding=4, generator=None):   # w2-03 w32_23: 0..8 drawn, clamped at 2p
    dy = torch.randint(0, 9, (len(images),), device=images.device, generator=generator).clamp(max=2 * padding)
    dx = torch.randint(0, 9, (len(images),), device=images.device, generator=generator).clamp(max=2 * padding)
    flip = torch.rand(len(images), device=images.device, generator=generator) < 0.5
    return _crop_with(images, padding, dy, dx, flip)


def offsets_read_back_with_tolist(images, padding=4, generator=None):   # w2-03 w32_19: .tolist(), torch.tensor(...)
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    dy = torch.tensor(dy.tolist(), device=images.device)
    dx = torch.tensor(dx.tolist(), device=images.device)
    return _crop_with(images, padding, dy, dx, flip)


def flips_above_one_half(images, padding=4, generator=None):   # w2-03 w32_02: rand > 0.5, the same probability
    dy, dx, _ = _draws(len(images), padding, images.device, generator)
    flip = torch.rand(len(images), device=images.device, generator=generator) > 0.5
    return _crop_with(images, padding, dy, dx, flip)


def flips_the_padded_image_first(images, padding=4, generator=None):   # w2-03 w32_14: flip, then crop
    n, _, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    padded = F.pad(images, (padding,) * 4)
    padded = torch.where(flip[:, None, None, None], padded.flip(-1), padded)
    rows = dy[:, None] + torch.arange(h, device=images.device)
    cols = dx[:, None] + torch.arange(w, device=images.device)
    idx = torch.arange(n, device=images.device)
    return padded[idx[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)   # w32_17: a view


def test_3_2_offsets_uniform_at_every_padding_the_check_uses():   # w2-03 w32_23 passed: padding 4 was the only one counted
    rejected("3.2", Mutant("offsets 0..8 clamped at 2*padding", offsets_for_padding_four_only,
                           "offsets vary across samples, uniformly", words="padding=2"), SEEDS)


def test_3_2_a_read_back_is_named_before_the_copy_down():        # w2-03 w32_19: the hint named the copy only
    rejected("3.2", Mutant("offsets read back with .tolist()", offsets_read_back_with_tolist,
                           "makes no copy from the host", words="values came back to the host first (Tensor.tolist"),
             SEEDS[:2])


def test_3_2_right_answers_of_the_reports_pass():
    for i, fn in enumerate((where_with_python_numbers, bernoulli_flips,
                            one_draw_for_both_offsets, flips_above_one_half, flips_the_padded_image_first)):
        passes("3.2", fn, [SEEDS[i % 3]])


def test_3_2_grid_sample_through_float_fails_any_dtype():
    # w1-03 M26/M47 judged it right (exact on uint8); since w8-03 the check also crops int64 images with values up to
    # 2**40, which images.float() rounds: the contract's "any dtype", as for the float mask blend of w32_18
    rejected("3.2", Mutant("w1-03 grid_sample on images.float()", grid_sample_nearest,
                           "every output is a crop of the padded input, mirrored or not",
                           words="do not survive a trip through float32"), SEEDS[:1])


@pytest.mark.parametrize("mutant", MUTANTS_32_WALKED, ids=repr)
def test_3_2_walked_mutants_rejected(mutant):
    rejected("3.2", mutant, [MUTANTS_32_WALKED.index(mutant) % 6])   # each failure is decided by the answer's structure


# -- 3.3 ------------------------------------------------------------------------------------------

_CONSTANTS = {}


def _consts(device):
    key = str(device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = (torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1),
                           torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1))
    return _CONSTANTS[key]


def good_normalize(images, labels):
    mean, std = _consts(images.device)
    return (images.float() / 255 - mean) / std, labels


def forgets_255(images, labels):
    mean, std = _consts(images.device)
    return (images.float() - mean) / std, labels


def no_normalize(images, labels):
    return images.float() / 255, labels


def swapped_constants(images, labels):
    mean, std = _consts(images.device)
    return (images.float() / 255 - std) / mean, labels


def imagenet_constants(images, labels):
    mean = torch.tensor([0.485, 0.456, 0.406], device=images.device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std, labels


def the_other_cifar_std(images, labels):                 # the (0.2023, 0.1994, 0.2010) of many repositories
    mean, _ = _consts(images.device)
    std = torch.tensor([0.2023, 0.1994, 0.2010], device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std, labels


def broadcasts_over_width(images, labels):               # constants of shape (3,) meet the last axis
    mean = torch.tensor(CIFAR10_MEAN, device=images.device)
    std = torch.tensor(CIFAR10_STD, device=images.device)
    return (images.float() / 255 - mean) / std, labels


def returns_images_only(images, labels):
    return good_normalize(images, labels)[0]


def float64(images, labels):
    out, labels = good_normalize(images, labels)
    return out.double(), labels


def constants_every_call(images, labels):                # the old reference solution: a copy per batch
    mean = torch.tensor(CIFAR10_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std, labels


HOST_MEAN = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
HOST_STD = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)


def host_constants_moved_every_call(images, labels):
    return (images.float() / 255 - HOST_MEAN.to(images.device)) / HOST_STD.to(images.device), labels


def normalises_on_the_host(images, labels):              # right on a CPU: two copies per batch on a GPU
    out = (images.cpu().float() / 255 - HOST_MEAN) / HOST_STD
    return out.to(images.device), labels


def returns_on_the_host(images, labels):
    return (images.cpu().float() / 255 - HOST_MEAN) / HOST_STD, labels


def labels_as_float(images, labels):
    return good_normalize(images, labels)[0], labels.float()


def checks_the_range_on_the_host(images, labels):       # a sanity check that reads a value back every batch
    if images.max() > 255:
        raise ValueError("not uint8 pixels")
    return good_normalize(images, labels)


def wraps_the_course(images, labels):
    from course_utils.device_data import normalize_uint8
    return normalize_uint8(images), labels


def wraps_the_course_batch(images, labels):
    from course_utils.device_data import normalize_batch
    return normalize_batch(images, labels)


def normalize_stub(images, labels):
    raise NotImplementedError("Exercise 3.3")


MUTANTS_33 = [
    Mutant("forgets / 255", forgets_255, "equals ToTensor + Normalize", words="divide by 255"),
    Mutant("no Normalize", no_normalize, "equals ToTensor + Normalize", words="Normalize is missing"),
    Mutant("mean and std swapped", swapped_constants, "equals ToTensor + Normalize"),
    Mutant("ImageNet's constants", imagenet_constants, "equals ToTensor + Normalize"),
    Mutant("the other CIFAR std", the_other_cifar_std, "equals ToTensor + Normalize"),
    Mutant("constants broadcast over the width", broadcasts_over_width, "equals ToTensor + Normalize"),
    Mutant("returns images only", returns_images_only, "returns (images, labels)"),
    Mutant("float64", float64, "returns float32"),
    Mutant("constants made every call", constants_every_call, "makes no copy from the host after the first batch"),
    Mutant("host constants moved every call", host_constants_moved_every_call,
           "makes no copy from the host after the first batch"),
    Mutant("normalises on the host", normalises_on_the_host, "never waits for the device"),
    Mutant("returns on the host", returns_on_the_host, "normalises on the device"),
    Mutant("labels as float", labels_as_float, "passes the labels through"),
    Mutant("checks the range on the host", checks_the_range_on_the_host, "never waits for the device"),
    Mutant("wraps normalize_uint8", wraps_the_course, "is your own code"),
    Mutant("wraps normalize_batch", wraps_the_course_batch, "is your own code"),
]


def test_3_3_right_answers_pass():
    passes("3.3", good_normalize, SEEDS)


@pytest.mark.parametrize("mutant", MUTANTS_33, ids=repr)
def test_3_3_mutants_rejected(mutant):
    rejected("3.3", mutant, SEEDS)


def test_3_3_stub():
    assert run_check("3.3", normalize_stub).status == "not_implemented"


# -- issue 37: the learner's walk (w1-03) and the expert's review (x-03), their exact answers ------

_BY_TYPE = {}


def constants_keyed_by_device_type(images, labels):     # w1-03 M12: right while there is one GPU
    key = images.device.type
    if key not in _BY_TYPE:
        _BY_TYPE[key] = (torch.tensor(CIFAR10_MEAN, device=images.device).view(1, 3, 1, 1),
                         torch.tensor(CIFAR10_STD, device=images.device).view(1, 3, 1, 1))
    mean, std = _BY_TYPE[key]
    return (images.float() / 255 - mean) / std, labels


_ONCE = []


def constants_made_once_anywhere(images, labels):       # w1-03 M2: the first call's device wins
    if not _ONCE:
        _ONCE.append(_consts(images.device))
    mean, std = _ONCE[0]
    return (images.float() / 255 - mean) / std, labels


_OUT = {}


def reused_output_buffer_33(images, labels):            # w1-03 M42: the next batch overwrites the last
    mean, std = _consts(images.device)
    key = (tuple(images.shape), str(images.device))
    if key not in _OUT:
        _OUT[key] = torch.empty(images.shape, dtype=torch.float32, device=images.device)
    out = _OUT[key]
    torch.div(images, 255, out=out)
    return out.sub_(mean).div_(std), labels


_KEPT = []


def keeps_its_outputs(images, labels):                  # w1-03 M43: memory grows by a batch a step
    out, labels = good_normalize(images, labels)
    _KEPT.append(out)
    return out, labels


def pinned_constants_copied_every_call(images, labels):  # x-03 X42: no host wait, but a copy every batch
    if not images.is_cuda:
        return good_normalize(images, labels)
    mean = HOST_MEAN.pin_memory().to(images.device, non_blocking=True)
    std = HOST_STD.pin_memory().to(images.device, non_blocking=True)
    return (images.float() / 255 - mean) / std, labels


# right answers the reports list: they must pass
def one_kernel_addcmul(images, labels):                  # x-03 X40: folded constants, one kernel on a GPU
    mean, std = _consts(images.device)
    key = "folded " + str(images.device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = (-mean / std, 1 / (255 * std))
    shift, scale = _CONSTANTS[key]
    return torch.addcmul(shift, images, scale), labels


def python_numbers_per_channel(images, labels):          # x-03 X41, w1-03 C1
    x = images.float() / 255
    return torch.stack([(x[:, c] - CIFAR10_MEAN[c]) / CIFAR10_STD[c] for c in range(3)], 1), labels


MUTANTS_33_WALKED = [
    Mutant("constants keyed by the device type", constants_keyed_by_device_type, "keeps its constants per device",
           words="cuda:0 and cuda:1"),
    Mutant("constants made once, for the first device", constants_made_once_anywhere,
           "keeps all its work on the device", words="keep the constants per device"),
    Mutant("one output buffer, reused", reused_output_buffer_33, "returns a new tensor for every batch"),
    Mutant("keeps its outputs", keeps_its_outputs, "keeps nothing of a batch after returning it"),
    Mutant("pinned constants copied every call", pinned_constants_copied_every_call,
           "makes no copy from the host after the first batch", words="one more copy launched every batch"),
    Mutant("constants made every call (the message)", constants_every_call,
           "makes no copy from the host after the first batch", words="the host waits for every kernel"),
]


def test_3_3_right_answers_of_the_reports_pass():
    for answer in (one_kernel_addcmul,):
        passes("3.3", answer, SEEDS)


@pytest.mark.parametrize("mutant", MUTANTS_33_WALKED, ids=repr)
def test_3_3_walked_mutants_rejected(mutant):
    _BY_TYPE.clear()
    _ONCE.clear()
    rejected("3.3", mutant, SEEDS)


def half_precision(images, labels):                      # w2-03 w33_07: "float16 to save bytes"
    mean, std = _consts(images.device)
    return (images.half() / 255 - mean) / std, labels


def constants_on_the_cpu(images, labels):                # w2-03 w33_16: cached per device, but made without device=
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std, labels


@pytest.mark.parametrize("mutant", [
    Mutant("float16 arithmetic", half_precision, "equals ToTensor + Normalize", words="16-bit float"),
    Mutant("constants on the CPU", constants_on_the_cpu, "keeps all its work on the device",
           words="your constants are on the CPU"),
], ids=repr)
def test_3_3_messages_name_the_mistake(mutant):          # w2-03: the hints pointed at the order and the keying
    rejected("3.3", mutant, SEEDS)


# -- w3-03: wrong answers that passed, and messages that pointed away ------------------------------

class PinsEachBatchItself(GoodPrefetcher):     # w3-03 #16: pin_memory() of every batch before the copy
    def copy(self, batch):
        batch = tuple(t.pin_memory() for t in batch)
        return super().copy(batch)


class SideStreamWaitsForTheStreamAtCopyTime(GoodPrefetcher):   # w3-03 #32: the hint's alternative, written naturally
    def copy(self, batch):
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return super().copy(batch)

    def hand_out(self, batch):
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return batch


class _WaitsForItsEvent(GoodPrefetcher):     # the consumer waits for self.event instead of the side stream
    def hand_out(self, batch):
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(self.event)
        for t in batch:
            t.record_stream(consumer)
        return batch


class EventBeforeTheCopy(_WaitsForItsEvent):   # w3-03 #17: the event recorded on the side stream before the copy
    def copy(self, batch):
        images, labels = batch
        with torch.cuda.stream(self.stream):
            self.event = torch.cuda.Event()
            self.event.record(self.stream)
            return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


class EventOnTheConsumer(_WaitsForItsEvent):   # w3-03 #18: recorded after the copy, but on the consumer's stream
    def copy(self, batch):
        out = super().copy(batch)
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(self.device))
        return out


MUTANTS_31_W3 = [
    Mutant("pins each batch itself", PinsEachBatchItself, "pins nothing in the training loop",
           words="called pin_memory()"),
    Mutant("side stream waits for the stream current at copy time", SideStreamWaitsForTheStreamAtCopyTime,
           "keeps a batch's memory for the consumer's stream (record_stream)", words="the wait must cover the stream"),
    Mutant("event recorded before the copy", EventBeforeTheCopy, "the consumer waits for the copy",
           words="the event was misplaced"),
    Mutant("event recorded on the consumer's stream", EventOnTheConsumer, "the consumer waits for the copy",
           words="an event recorded on the loop's own stream"),
]


@pytest.mark.parametrize("mutant", MUTANTS_31_W3, ids=repr)
def test_3_1_w3_mutants_rejected(mutant):
    rejected("3.1", mutant, SEEDS[:2])


def first_sample_left_as_is(images, padding=4, generator=None):   # w3-03 #28: a subset, invisible in the shares
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    dy = torch.cat([dy.new_full((1,), padding), dy[1:]])
    dx = torch.cat([dx.new_full((1,), padding), dx[1:]])
    flip = torch.cat([flip.new_zeros(1), flip[1:]])
    return _crop_with(images, padding, dy, dx, flip)


def exactly_half_flipped(images, padding=4, generator=None):      # w3-03 #18: flips not independent
    dy, dx, _ = _draws(len(images), padding, images.device, generator)
    flip = torch.randperm(len(images), device=images.device, generator=generator) < len(images) // 2
    return _crop_with(images, padding, dy, dx, flip)


def flips_47_percent(images, padding=4, generator=None):          # w3-03 s3 (0.49 and 0.48 lie inside the
    dy, dx, _ = _draws(len(images), padding, images.device, generator)   # check's 4.2-sd band: their fate is the
    flip = torch.rand(len(images), device=images.device, generator=generator) < 0.47    # seed's, not tested)
    return _crop_with(images, padding, dy, dx, flip)


def other_draw_order(images, padding=4, generator=None):          # w3-03 #24 (right): one (2, N) draw, flips first
    n, dev = len(images), images.device
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    d = torch.randint(0, 2 * padding + 1, (2, n), device=dev, generator=generator)
    return _crop_with(images, padding, d[0], d[1], flip)


def flip_then_crop(images, padding=4, generator=None):            # w3-03 #21 (right): mirror first, then crop
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    mirrored = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
    return _crop_with(mirrored, padding, dy, dx, torch.zeros_like(flip))


@pytest.mark.parametrize("mutant", [
    Mutant("first sample never augmented", first_sample_left_as_is,
           "augments every sample, at every position of the batch", words="sample 0 of the batch"),
    Mutant("exactly half flipped by a permutation", exactly_half_flipped,
           "flips each sample independently, with probability 1/2", words="exactly half flipped"),
    Mutant("flips 47%", flips_47_percent, "flips half the samples"),
], ids=repr)
def test_3_2_w3_mutants_rejected(mutant):
    rejected("3.2", mutant, SEEDS[:3])


def test_3_2_w3_right_answers_pass():
    for i, fn in enumerate((other_draw_order, flip_then_crop)):
        passes("3.2", fn, [SEEDS[i]])


def constants_filled_every_call(images, labels):                  # w3-03 #28: 6 fills + 2 stacks per batch
    dev = images.device
    m = torch.stack([torch.full((), v, device=dev) for v in CIFAR10_MEAN]).view(1, 3, 1, 1)
    s = torch.stack([torch.full((), v, device=dev) for v in CIFAR10_STD]).view(1, 3, 1, 1)
    return (images.float() / 255 - m) / s, labels


def torchvision_normalize(images, labels):                        # w3-03 #24: torchvision's Normalize on the device
    import torchvision.transforms as T
    return T.Normalize(CIFAR10_MEAN, CIFAR10_STD)(images.float() / 255), labels


def in_place_on_a_float_copy(images, labels):                    # w3-03 #27 (right)
    mean, std = _consts(images.device)
    return images.float().div_(255).sub_(mean).div_(std), labels


@pytest.mark.parametrize("mutant", [
    Mutant("constants filled on the device every call", constants_filled_every_call,
           "makes the constants once per device, not every batch", words="torch.full at " + __file__),
    Mutant("torchvision's Normalize", torchvision_normalize, "never waits for the device",
           words="torchvision's Normalize builds its mean and std from host values on every call"),
], ids=repr)
def test_3_3_w3_mutants_rejected(mutant):
    rejected("3.3", mutant, SEEDS[:2])


def test_3_3_w3_right_answers_pass():
    passes("3.3", in_place_on_a_float_copy, SEEDS[:2])


# -- w6-03: wrong answers that passed, and messages that pointed away ------------------------------

class SpinsOnStreamQuery(GoodPrefetcher):      # w6-03 3.1 #1: the host polls the side stream, no wait_stream
    def hand_out(self, batch):
        while not self.stream.query():
            pass
        consumer = torch.cuda.current_stream(self.device)
        for t in batch:
            t.record_stream(consumer)
        return batch


class SpinsOnEventQuery(GoodPrefetcher):       # w6-03 3.1 #2: an event after the copy, polled by the host
    def copy(self, batch):
        out = super().copy(batch)
        event = torch.cuda.Event()
        event.record(self.stream)
        self.events[id(out)] = event
        return out

    def hand_out(self, batch):
        event = self.events.pop(id(batch))
        while not event.query():
            pass
        consumer = torch.cuda.current_stream(self.device)
        for t in batch:
            t.record_stream(consumer)
        return batch

    def __iter__(self):
        self.events = {}
        yield from super().__iter__()


class ConsumerAskedOncePerPass(GoodPrefetcher):   # w6-03 3.1 #3: the loop's stream asked at the top of __iter__
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        consumer = torch.cuda.current_stream(self.device)
        batches = iter(self.loader)
        following = next(batches, None)
        upcoming = self.copy(following) if following is not None else None
        while upcoming is not None:
            consumer.wait_stream(self.stream)
            for t in upcoming:
                t.record_stream(consumer)
            batch = upcoming
            following = next(batches, None)
            upcoming = self.copy(following) if following is not None else None
            yield batch


class SetsTheStreamForGood(GoodPrefetcher):    # w6-03: torch.cuda.set_stream before the copies, never reset
    def copy(self, batch):
        torch.cuda.set_stream(self.stream)
        images, labels = batch
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


class DecidesByTheDeviceString(GoodPrefetcher):  # w6-03: str(device) == "cuda" is False for cuda:1
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.stream = torch.cuda.Stream(self.device) if str(device) == "cuda" else None


MUTANTS_31_W6 = [
    Mutant("spins on stream.query()", SpinsOnStreamQuery, "never makes the host wait", words="a loop on query()"),
    Mutant("spins on event.query()", SpinsOnEventQuery, "never makes the host wait",
           words="event.query() in a loop"),
    Mutant("the loop's stream asked once per pass", ConsumerAskedOncePerPass, "the consumer waits for the copy",
           words="not once per pass"),
    Mutant("torch.cuda.set_stream, never reset", SetsTheStreamForGood,
           "hands each batch to the training loop on the loop's own stream", words="torch.cuda.set_stream (at "),
    Mutant("str(device) == 'cuda'", DecidesByTheDeviceString, "copies asynchronously", words="self.device.type"),
]


@pytest.mark.parametrize("mutant", MUTANTS_31_W6, ids=repr)
def test_3_1_w6_mutants_rejected(mutant):
    rejected("3.1", mutant, SEEDS)


def test_virtual_query_is_false_while_a_copy_is_in_flight():
    from course_utils.checks.virtual_cuda import VirtualCuda
    with VirtualCuda() as vc:
        side = torch.cuda.Stream(vc.device)
        with torch.cuda.stream(side):
            x = torch.ones(4).pin_memory().to(vc.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(side)
        assert not side.query() and not vc.syncs          # asked once: in flight, no wait
        assert side.query() and len(vc.syncs) == 1          # asked again: the host spun until it was done
        assert event.query() and "stream.query() in a loop" in vc.syncs[0].what
        del x


def test_virtual_set_stream_is_the_current_stream_until_set_again():
    from course_utils.checks.virtual_cuda import VirtualCuda
    with VirtualCuda() as vc:
        a, b = torch.cuda.Stream(vc.device), torch.cuda.Stream(vc.device)
        torch.cuda.set_stream(a)
        assert torch.cuda.current_stream(vc.device) is a
        with torch.cuda.stream(b):
            torch.cuda.set_stream(vc.default_stream)
            assert torch.cuda.current_stream(vc.device) is vc.default_stream
        assert torch.cuda.current_stream(vc.device) is a     # the block put back what was current before it
        assert vc.set_streams


def float32_round_trip(images, padding=4, generator=None):        # w6-03 3.2: right values, 4 bytes a pixel
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    return _crop_with(images.float(), padding, dy, dx, flip).to(images.dtype)


def both_orientations_then_where(images, padding=4, generator=None):   # w6-03 3.2: right, at extra cost
    dy, dx, flip = _draws(len(images), padding, images.device, generator)
    plain = _crop_with(images, padding, dy, dx, torch.zeros_like(flip))
    return torch.where(flip[:, None, None, None], plain.flip(-1), plain)


def test_3_2_w6_float_round_trip_named():
    rejected("3.2", Mutant("a float32 round trip", float32_round_trip, "uses memory in proportion to the batch",
                           words="wider dtype"), SEEDS[:2])


def test_3_2_w6_right_at_extra_cost_passes():    # the spec asks for exact crops in memory in proportion: it is
    passes("3.2", both_orientations_then_where, SEEDS[:1])


_KEPT_INPUTS = {}


def keeps_the_input_batch(images, labels):               # w6-03 3.3 #1: the uint8 batch kept in the cache's dict
    _KEPT_INPUTS["last_in"] = images
    return good_normalize(images, labels)


def keeps_a_view_of_the_input(images, labels):          # the same, through a view in a closure's dict
    _KEPT_INPUTS["first"] = images[0]
    return good_normalize(images, labels)


_WIDE = {}


def float64_round_trip(images, labels):                  # w6-03 3.3 #2: right values through float64
    key = str(images.device)
    if key not in _WIDE:
        _WIDE[key] = (torch.tensor(CIFAR10_MEAN, dtype=torch.float64, device=images.device).view(1, 3, 1, 1),
                      torch.tensor(CIFAR10_STD, dtype=torch.float64, device=images.device).view(1, 3, 1, 1))
    m, s = _WIDE[key]
    return ((images.double() / 255 - m) / s).float(), labels


def divides_by_256(images, labels):
    mean, std = _consts(images.device)
    return (images.float() / 256 - mean) / std, labels


def std_plus_epsilon(images, labels):
    mean, std = _consts(images.device)
    return (images.float() / 255 - mean) / (std + 1e-3), labels


def batch_statistics(images, labels):                    # the neighbouring statistic: the batch's own
    x = images.float() / 255
    return (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True), labels


MUTANTS_33_W6 = [
    Mutant("keeps the input batch", keeps_the_input_batch, "keeps nothing of a batch after returning it",
           words="the uint8 images passed in"),
    Mutant("keeps a view of the input", keeps_a_view_of_the_input, "keeps nothing of a batch after returning it",
           words="the uint8 images passed in"),
    Mutant("a float64 round trip", float64_round_trip, "computes in float32", words="float64"),
    Mutant("/ 256", divides_by_256, "equals ToTensor + Normalize", words="(not 256)"),
    Mutant("std + 1e-3", std_plus_epsilon, "equals ToTensor + Normalize", words="no epsilon"),
    Mutant("the batch's statistics", batch_statistics, "equals ToTensor + Normalize", words="batch's own statistics"),
    Mutant("constants made every call, located", constants_every_call,
           "makes no copy from the host after the first batch", words="torch.tensor at " + __file__),
]


@pytest.mark.parametrize("mutant", MUTANTS_33_W6, ids=repr)
def test_3_3_w6_mutants_rejected(mutant):
    _KEPT_INPUTS.clear()
    rejected("3.3", mutant, SEEDS[:3])


# -- walk w7-03 -----------------------------------------------------------------------------------
# 3.1: state of a pass on self (the iterator protocol, or a generator's batch in flight on self)
# passed: a `break` left the batch copied ahead referenced, and two passes at once (zip(p, p), a
# loop nested in another) handed out each other's batches. w2-03 had judged ApexResetInIter (the
# same design) acceptable; the walk showed zip(p, p) wrong on the CPU, so it is a mutant now.

class IteratorProtocolStateOnSelf:               # w7-03 w31_41, the walker's code
    def __init__(self, loader, device):
        self.loader = loader
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None

    def _copy_next(self):
        batch = next(self.batches, None)
        if batch is None:
            return None
        if not self.cuda:
            return tuple(t.to(self.device) for t in batch)
        with torch.cuda.stream(self.stream):
            return tuple(t.to(self.device, non_blocking=True) for t in batch)

    def __iter__(self):
        self.batches = iter(self.loader)
        self.upcoming = self._copy_next()
        return self

    def __next__(self):
        if self.upcoming is None:
            raise StopIteration
        if self.cuda:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self.stream)
            for t in self.upcoming:
                t.record_stream(consumer)
        current, self.upcoming = self.upcoming, self._copy_next()
        return current


class InFlightOnSelf(GoodPrefetcher):            # w7-03 w31_32: a generator, the batch in flight on self
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        batches = iter(self.loader)

        def copy_next():
            following = next(batches, None)
            return None if following is None else self.copy(following)

        self.upcoming = copy_next()
        while self.upcoming is not None:
            current = self.hand_out(self.upcoming)
            self.upcoming = copy_next()
            yield current


class LoaderIteratorOnSelf(GoodPrefetcher):      # near miss of w31_32: only the loader's iterator on self
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        self.batches = iter(self.loader)
        upcoming = next(self.batches, None)
        upcoming = None if upcoming is None else self.copy(upcoming)
        while upcoming is not None:
            current = self.hand_out(upcoming)
            following = next(self.batches, None)
            upcoming = None if following is None else self.copy(following)
            yield current


class CloneOnTheConsumer(GoodPrefetcher):        # w7-03 w31_34: one more device copy per batch, on the loop's stream
    def __iter__(self):
        for batch in super().__iter__():
            yield tuple(t.clone() for t in batch) if self.stream is not None else batch


class ConvertsOnTheConsumer(GoodPrefetcher):     # its near miss: a float conversion at hand-out
    def hand_out(self, batch):
        images, labels = super().hand_out(batch)
        return images.float().to(torch.uint8), labels


class FirstBatchNotWaited(GoodPrefetcher):       # w7-03 w31_45: "the first copy had the whole start-up to finish"
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        batches = iter(self.loader)
        upcoming = next(batches, None)
        upcoming = None if upcoming is None else self.copy(upcoming)
        first = True
        while upcoming is not None:
            consumer = torch.cuda.current_stream(self.device)
            if not first:
                consumer.wait_stream(self.stream)
            first = False
            for t in upcoming:
                t.record_stream(consumer)
            following = next(batches, None)
            current, upcoming = upcoming, None if following is None else self.copy(following)
            yield current


MUTANTS_31_W7 = [
    Mutant("w31_41 iterator protocol, state on self", IteratorProtocolStateOnSelf,
           "keeps no batch the training loop is done with", words="self.upcoming"),
    Mutant("w2-03 w31_22 apex style reset in __iter__", ApexResetInIter,
           "keeps no batch the training loop is done with", words="two passes at once"),
    Mutant("w31_32 the batch in flight on self", InFlightOnSelf, "keeps no batch the training loop is done with",
           words="self.upcoming"),
    Mutant("the loader's iterator on self", LoaderIteratorOnSelf, "each pass is a pass of its own, also two at once",
           words="self.batches"),
    Mutant("w31_34 a clone on the loop's stream", CloneOnTheConsumer, "launches nothing on the device but the copies",
           words="on the loop's own stream (aten.clone"),
    Mutant("a conversion at hand-out", ConvertsOnTheConsumer, "launches nothing on the device but the copies",
           words="loop's own stream"),
    Mutant("w31_45 no wait for the first batch", FirstBatchNotWaited, "the consumer waits for the copy",
           words="not before the first batch of the pass"),
]


@pytest.mark.parametrize("mutant", MUTANTS_31_W7, ids=repr)
def test_3_1_w7_mutants_rejected(mutant):
    rejected("3.1", mutant, SEEDS[:1])


def test_3_1_w7_zip_of_two_passes_is_right_for_the_right_answer():
    passes("3.1", GoodPrefetcher, SEEDS[1:2])


# 3.2


def generator_state_copied(images, padding=4, generator=None):   # w7-03 w32_33: the caller's generator never moves
    if generator is not None:
        g = torch.Generator(device=images.device)
        g.set_state(generator.get_state())
        generator = g
    return crop_flip(images, padding, generator)


_OWN = {}


def own_generator_at_seed_0(images, padding=4, generator=None):  # w7-03 w32_16: a private generator for None
    if generator is None:
        generator = _OWN.setdefault(str(images.device), torch.Generator(device=images.device).manual_seed(0))
    return crop_flip(images, padding, generator)


def both_crops_then_where_walked(images, padding=4, generator=None):   # w7-03 w32_24 (w6-03: allowed)
    n, c, h, w = images.shape
    dev = images.device
    dy = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    padded = F.pad(images, (padding,) * 4)
    rows = dy[:, None] + torch.arange(h, device=dev)
    cols = dx[:, None] + torch.arange(w, device=dev)
    idx = torch.arange(n, device=dev)
    out = padded[idx[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    mirrored = out.flip(-1)
    return torch.where(flip[:, None, None, None], mirrored, out)


MUTANTS_32_W7 = [
    Mutant("w32_33 the generator's state copied", generator_state_copied, "draws new crops on every call",
           words="did not advance"),
    Mutant("w32_16 a private generator at seed 0", own_generator_at_seed_0,
           "with generator=None, reproducible under torch.manual_seed", words="A generator of your own"),
]


@pytest.mark.parametrize("mutant", MUTANTS_32_W7, ids=repr)
def test_3_2_w7_mutants_rejected(mutant):
    _OWN.clear()
    rejected("3.2", mutant, SEEDS[:1])


def test_3_2_w7_both_crops_then_where_passes():   # twice the memory, a constant number of launches: in the spec
    passes("3.2", both_crops_then_where_walked, SEEDS[:1])


# 3.3

_U8 = {}


def uint8_constants(images, labels):             # w7-03 w33_41: the check crashed in its own lstsq on inf
    key = str(images.device)
    if key not in _U8:
        _U8[key] = (torch.tensor(CIFAR10_MEAN, device=images.device, dtype=images.dtype).view(1, 3, 1, 1),
                    torch.tensor(CIFAR10_STD, device=images.device, dtype=images.dtype).view(1, 3, 1, 1))
    mean, std = _U8[key]
    return (images.float() / 255 - mean) / std, labels


def channel_loop(images, labels):                # w7-03 w33_24: 9 operations a batch, as many launches
    x = images.float() / 255
    return torch.stack([(x[:, c] - m) / s for c, (m, s) in enumerate(zip(CIFAR10_MEAN, CIFAR10_STD))], 1), labels


def synchronize_every_call(images, labels):      # w7-03 w33_36
    out = good_normalize(images, labels)
    if images.is_cuda:
        torch.cuda.synchronize(images.device)
    return out


_SYNCED = set()


def synchronize_first_call(images, labels):      # w7-03 w33_43
    if images.is_cuda and str(images.device) not in _SYNCED:
        _SYNCED.add(str(images.device))
        torch.cuda.synchronize(images.device)
    return good_normalize(images, labels)


def labels_cloned(images, labels):               # w7-03 w33_28: 5 operations, passes
    out, _ = good_normalize(images, labels)
    return out, labels.clone()


MUTANTS_33_W7 = [
    Mutant("w33_41 uint8 constants (inf)", uint8_constants, "equals ToTensor + Normalize", words="not finite"),
    Mutant("w33_24 a loop over the channels", channel_loop, "runs a few operations per batch", words="9 operations"),
    Mutant("w33_36 synchronize every call", synchronize_every_call, "never waits for the device",
           words="the host waited for the device (torch.cuda.synchronize"),
    Mutant("w33_43 synchronize on the first call", synchronize_first_call, "never waits for the device",
           words="the host waited for the device (torch.cuda.synchronize"),
]


@pytest.mark.parametrize("mutant", MUTANTS_33_W7, ids=repr)
def test_3_3_w7_mutants_rejected(mutant):
    _U8.clear(), _SYNCED.clear()
    rejected("3.3", mutant, SEEDS[:1])


def test_3_3_w7_python_numbers_per_channel_now_rejected():
    # x-03 X41 / w1-03 judged it right (the values are); w7-03: 9 launches a batch where torch.full constants made
    # every call (2 launches more than the course's 4) are rejected for their launches: one rule for both
    rejected("3.3", Mutant("x-03 X41 Python numbers per channel", python_numbers_per_channel,
                           "runs a few operations per batch", words="loop over the channels"), SEEDS[:1])


def test_3_3_w7_labels_cloned_passes():
    passes("3.3", labels_cloned, SEEDS[:1])


def _clones(k):
    def normalize(images, labels):
        out, labels = good_normalize(images, labels)
        for _ in range(k):
            out = out.clone()
        return out, labels
    normalize.__name__ = f"good_normalize_then_{k}_clones"
    return normalize


def test_3_3_the_operations_limit_is_where_the_verdict_flips():   # the near-miss rule: 5 pass, 6 fail (w8-03)
    passes("3.3", labels_cloned, SEEDS[:1])       # 5 operations, none a needless copy of the batch (w9-03)
    rejected("3.3", Mutant("6 operations a batch", _clones(2), "runs a few operations per batch",
                           words="6 operations"), SEEDS[:1])


# -- walk w8-03 -----------------------------------------------------------------------------------------------------

def crop_flip_float_mask_blend(images, padding=4, generator=None):
    """w8-03 w32_18: the crop by indexing, the flip blended with a float mask: exact on uint8, not on int64."""
    n, c, h, w = images.shape
    dev = images.device
    dy = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    flip = (torch.rand(n, device=dev, generator=generator) < 0.5).float()[:, None, None, None]
    padded = F.pad(images, (padding,) * 4)
    rows = dy[:, None] + torch.arange(h, device=dev)
    cols = dx[:, None] + torch.arange(w, device=dev)
    n_idx = torch.arange(n, device=dev)
    out = padded[n_idx[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    return (out * (1 - flip) + out.flip(-1) * flip).to(images.dtype)


def crop_flip_gather_full_index(images, padding=4, generator=None):
    """w8-03 w32_30: two gathers with int64 indices the batch's shape: 8 bytes of index per pixel, yet a
    peak within the 16x the contract's 'memory in proportion to the batch' allows: right (see below)."""
    n, c, h, w = images.shape
    dev = images.device
    dy = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    flip = torch.rand(n, device=dev, generator=generator) < 0.5
    padded = F.pad(images, (padding,) * 4)
    rows = (dy[:, None] + torch.arange(h, device=dev))[:, None, :, None].expand(n, c, h, padded.shape[3])
    by_rows = torch.gather(padded, 2, rows.contiguous())
    cols = dx[:, None] + torch.arange(w, device=dev)
    cols = torch.where(flip[:, None], cols.flip(-1), cols)[:, None, None, :].expand(n, c, h, w)
    return torch.gather(by_rows, 3, cols.contiguous())


def test_3_2_w8_a_flip_blended_in_floats_fails_any_dtype():
    # exact on uint8 and float32 images; the check's int64 images (values up to 2**40) show the trip through float
    rejected("3.2", Mutant("w8-03 w32_18 flip blended with a float mask", crop_flip_float_mask_blend,
                           "every output is a crop of the padded input, mirrored or not",
                           words="do not survive a trip through float32"), SEEDS[:2])


def test_3_2_w8_gathers_with_full_int64_indices_pass():
    # w8-03 measured 80x the batch in total allocations, but the peak stays inside the contract's 16x: the spec
    # asks for memory in proportion to the batch, not the least memory; kept passing (stated in the closing note)
    passes("3.2", crop_flip_gather_full_index, SEEDS[:1])


def normalize_folded_every_call(images, labels):
    """w8-03 w33_15: scale and shift folded from the constants on every call, then one addcmul: 6 operations."""
    key = str(images.device)
    if key not in _U8:
        _U8[key] = (torch.tensor(CIFAR10_MEAN, device=images.device).view(1, 3, 1, 1),
                    torch.tensor(CIFAR10_STD, device=images.device).view(1, 3, 1, 1))
    mean, std = _U8[key]
    scale = 1 / (255 * std)
    shift = -mean / std
    return torch.addcmul(shift, images.float(), scale), labels


def test_3_3_w8_folding_every_call_is_told_to_fold_once_not_about_a_loop():
    _U8.clear()
    result = run_check("3.3", normalize_folded_every_call)
    assert result.status == "fail" and "property 'runs a few operations per batch'" in result.message, result.message
    assert "computed once with them" in result.message and "loop over the" not in result.message, result.message


def test_3_3_w8_two_needless_clones_fail():
    rejected("3.3", Mutant("w8-03 w33_28 two needless clones (6 operations)", _clones(2),
                           "runs a few operations per batch", words="no .clone()"), SEEDS[:1])


# w8-03: five crop mistakes got the one generic hint; each is now named (the walk's code, one seed each)

def _idx_crop(source, rows, cols, flip=None):
    n = len(source)
    if flip is not None:
        cols = torch.where(flip[:, None], cols.flip(-1), cols)
    n_idx = torch.arange(n, device=source.device)
    return source[n_idx[:, None, None], :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def crop_by_rolling(images, padding=4, generator=None):            # w8-03 w32_12: no padding, pixels wrap
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    rows = (torch.arange(h, device=images.device)[None, :] + dy[:, None] - padding) % h
    cols = (torch.arange(w, device=images.device)[None, :] + dx[:, None] - padding) % w
    return _idx_crop(images, rows, cols, flip)


def crop_flipping_rows(images, padding=4, generator=None):         # w8-03 w32_13: upside down
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    rows = dy[:, None] + torch.arange(h, device=images.device)
    rows = torch.where(flip[:, None], rows.flip(-1), rows)
    cols = dx[:, None] + torch.arange(w, device=images.device)
    return _idx_crop(F.pad(images, (padding,) * 4), rows, cols)


def crop_reflect_padded(images, padding=4, generator=None):        # w8-03 w32_15: "looks nicer"
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    padded = F.pad(images.float(), (padding,) * 4, mode="reflect").to(images.dtype)
    return _idx_crop(padded, dy[:, None] + torch.arange(h, device=images.device),
                     dx[:, None] + torch.arange(w, device=images.device), flip)


def crop_clamped_to_the_edges(images, padding=4, generator=None):  # w8-03 w32_23: edge pixels repeat
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    rows = (dy[:, None] - padding + torch.arange(h, device=images.device)).clamp(0, h - 1)
    cols = (dx[:, None] - padding + torch.arange(w, device=images.device)).clamp(0, w - 1)
    return _idx_crop(images, rows, cols, flip)


def crop_padded_on_one_side(images, padding=4, generator=None):    # w8-03 w32_24: all the padding right and bottom
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, padding, images.device, generator)
    padded = F.pad(images, (0, 2 * padding, 0, 2 * padding))
    return _idx_crop(padded, dy[:, None] + torch.arange(h, device=images.device),
                     dx[:, None] + torch.arange(w, device=images.device), flip)


def crop_padding_four_hard_coded(images, padding=4, generator=None):   # w8-03 w32_17
    n, c, h, w = images.shape
    dy, dx, flip = _draws(n, 4, images.device, generator)
    return _idx_crop(F.pad(images, (4,) * 4), dy[:, None] + torch.arange(h, device=images.device),
                     dx[:, None] + torch.arange(w, device=images.device), flip)


_CROP_PROP = "every output is a crop of the padded input, mirrored or not"
W8_CROP_MUTANTS = [
    Mutant("w8-03 w32_12 rolls (wraps around)", crop_by_rolling, _CROP_PROP, words="yours wraps around"),
    Mutant("w8-03 w32_13 flips the rows", crop_flipping_rows, _CROP_PROP, words="yours turned the sample upside down"),
    Mutant("w8-03 w32_15 reflect padding", crop_reflect_padded, _CROP_PROP, words="yours pads by reflection"),
    Mutant("w8-03 w32_23 clamps to the edges", crop_clamped_to_the_edges, _CROP_PROP,
           words="yours repeats the edge pixels"),
    Mutant("w8-03 w32_24 pads one side", crop_padded_on_one_side, _CROP_PROP,
           words="yours padded only the right and bottom"),
    Mutant("w8-03 w32_17 padding 4 hard-coded", crop_padding_four_hard_coded, _CROP_PROP,
           words="as if padding were 4"),
]


@pytest.mark.parametrize("mutant", W8_CROP_MUTANTS, ids=repr)
def test_3_2_w8_each_crop_mistake_named(mutant):
    rejected("3.2", mutant, SEEDS[:1])


class TwoAhead:
    """w8-03 w31_09: two batches in flight (a queue of two copies): told to keep one ahead, not 'do not list() it'."""
    def __init__(self, loader, device):
        self.loader = loader
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __iter__(self):
        if self.stream is None:
            for images, labels in self.loader:
                yield images.to(self.device), labels.to(self.device)
            return
        batches = iter(self.loader)

        def copy_next():
            batch = next(batches, None)
            if batch is None:
                return None
            with torch.cuda.stream(self.stream):
                return tuple(t.to(self.device, non_blocking=True) for t in batch)
        queue = [copy_next(), copy_next()]
        while queue[0] is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self.stream)
            for t in queue[0]:
                t.record_stream(consumer)
            batch = queue.pop(0)
            queue.append(copy_next() if queue[-1] is not None else None)
            yield batch


def test_3_1_w8_two_ahead_told_one_ahead_and_a_list_told_not_to_list():
    rejected("3.1", Mutant("w8-03 w31_09 two ahead", TwoAhead, "reads the loader as it goes",
                           words="yours keeps 2 batches in flight: at most one ahead"), SEEDS[:2])
    result = run_check("3.1", ListsTheLoader)
    assert "do not list() it" in result.message or "property 'reads the loader as it goes'" not in result.message, \
        result.message


# -- w9-03 ----------------------------------------------------------------------------------------

class BlockingIfUnpinned(GoodPrefetcher):     # w9-03 w31_27: pageable batches copied blocking, on the loop's stream
    def copy(self, batch):
        if not all(t.is_pinned() for t in batch):
            return tuple(t.to(self.device) for t in batch)
        return super().copy(batch)


class SyncsIfUnpinned(GoodPrefetcher):        # w9-03 w31_36: a host wait per pageable batch
    def copy(self, batch):
        pinned = all(t.is_pinned() for t in batch)
        with torch.cuda.stream(self.stream):
            out = tuple(t.to(self.device, non_blocking=pinned) for t in batch)
        if not pinned:
            self.stream.synchronize()
        return out


class NonBlockingThenSyncsIfUnpinned(GoodPrefetcher):   # w31_36 with non_blocking=True: the wait alone
    def copy(self, batch):
        out = super().copy(batch)
        if not all(t.is_pinned() for t in batch):
            self.stream.synchronize()
        return out


class UnpinnedOnTheLoopStream(GoodPrefetcher):  # w9-03 w31_37: pageable batches copied on the loop's own stream
    def copy(self, batch):
        if not all(t.is_pinned() for t in batch):
            return tuple(t.to(self.device, non_blocking=True) for t in batch)
        return super().copy(batch)


class WaitsOnTheDefaultStream(GoodPrefetcher):  # w9-03 w31_31: default_stream(device), not current_stream(device)
    def hand_out(self, batch):
        consumer = torch.cuda.default_stream(self.device)
        consumer.wait_stream(self.stream)
        for t in batch:
            t.record_stream(consumer)
        return batch


class NewStreamPerBatch(GoodPrefetcher):       # w9-03 w31_24 (right): torch.cuda.Stream() takes a pooled stream
    def copy(self, batch):
        self.stream = torch.cuda.Stream(self.device)
        return super().copy(batch)


MUTANTS_31_W9 = [
    Mutant("w9-03 w31_27 blocking copy if unpinned", BlockingIfUnpinned, "copies asynchronously",
           words="copies of unpinned batches were blocking"),
    Mutant("w9-03 w31_36 synchronize if unpinned", SyncsIfUnpinned, "copies asynchronously",
           words="do not branch on is_pinned()"),
    Mutant("w31_36, non_blocking, synchronize if unpinned", NonBlockingThenSyncsIfUnpinned,
           "never makes the host wait", words="for unpinned batches (stream.synchronize"),
    Mutant("w9-03 w31_37 unpinned on the loop's stream", UnpinnedOnTheLoopStream, "copies on a side stream",
           words="copies of unpinned batches were queued on the training loop's own stream"),
    Mutant("w9-03 w31_31 waits on the default stream", WaitsOnTheDefaultStream, "the consumer waits for the copy",
           words="yours made the device's default stream wait"),
]


@pytest.mark.parametrize("mutant", MUTANTS_31_W9, ids=repr)
def test_3_1_w9_pageable_pass_and_default_stream(mutant):
    rejected("3.1", mutant, SEEDS[:1])


def test_3_1_w9_a_new_stream_per_batch_passes_when_kept_with_its_batch():
    # w9-03 w31_24: a new stream per batch is right when each batch's wait is on the stream that
    # copied it (torch.cuda.Stream() draws from a per-device pool). Kept on self (NewStreamPerBatch)
    # it is wrong under zip(p, p): the other pass replaces it (w10-03, a mutant below).
    passes("3.1", PooledStreamWithTheBatch, SEEDS[:1])


def test_3_3_w9_one_needless_clone_fails_on_its_own():   # w9-03 w33_20: 5 operations, within the limit, passed
    rejected("3.3", Mutant("w9-03 w33_20 one needless clone (5 operations)", _clones(1),
                           "makes no needless copy of the batch", words="aten.clone at"), SEEDS[:1])


def test_3_3_w9_vector_constants_fail_on_the_shape():   # w9-03 w33_24: W was 3 in the check's first batch
    rejected("3.3", Mutant("w9-03 w33_24 (3,) constants", broadcasts_over_width, "equals ToTensor + Normalize",
                           words="(1, 3, 1, 1)"), SEEDS[:2])


def gathers_with_batch_sized_indices(images, padding=4, generator=None):   # w9-03 w32_21: 22x, int64 indices
    n, c, h, w = images.shape
    dev = images.device
    dy, dx, flip = _draws(n, padding, dev, generator)
    padded = F.pad(images, (padding,) * 4)
    rows = (dy[:, None] + torch.arange(h, device=dev)).view(n, 1, h, 1).expand(n, c, h, w + 2 * padding).contiguous()
    ar = torch.arange(w, device=dev)
    cols = (dx[:, None] + torch.where(flip[:, None], ar.flip(0), ar)).view(n, 1, 1, w).expand(n, c, h, w).contiguous()
    return padded.gather(2, rows).gather(3, cols)


def chunks_leave_the_tail(images, padding=4, generator=None):   # w9-03 w32_22: the last partial chunk as it was
    out = images.clone()
    for s in range(0, images.shape[0] - 4095, 4096):
        out[s:s + 4096] = crop_flip(images[s:s + 4096], padding, generator)
    return out


def one_crop_drawn_on_the_host(images, padding=4, generator=None):   # w9-03 w32_01: transforms.v2 on a batch
    n, c, h, w = images.shape
    dy, dx = torch.randint(0, 2 * padding + 1, (2,), generator=generator).tolist()
    out = F.pad(images, (padding,) * 4)[:, :, dy:dy + h, dx:dx + w]
    if torch.rand(1, generator=generator).item() < 0.5:
        out = out.flip(-1)
    return out.contiguous()


MUTANTS_32_W9 = [
    Mutant("w9-03 w32_21 batch-sized int64 indices", gathers_with_batch_sized_indices,
           "uses memory in proportion to the batch", words="int64 index tensors as large as the batch"),
    Mutant("w9-03 w32_22 chunks leave the tail", chunks_leave_the_tail,
           "augments every sample, at every position of the batch", words="came back as they went in"),
    Mutant("w9-03 w32_01 one crop, drawn on the host", one_crop_drawn_on_the_host,
           "offsets vary across samples, uniformly", words="the same crop and the same flip"),
]


@pytest.mark.parametrize("mutant", MUTANTS_32_W9, ids=repr)
def test_3_2_w9_messages_name_the_mistake(mutant):
    rejected("3.2", mutant, SEEDS[:1])


def clones_the_uint8_input(images, labels):      # near miss of w33_20: the copy made before the conversion
    return good_normalize(images.clone(), labels)


def test_3_3_w9_a_clone_of_the_input_is_a_needless_copy_too():
    rejected("3.3", Mutant("clone of the uint8 batch (5 operations)", clones_the_uint8_input,
                           "makes no needless copy of the batch", words="aten.clone at"), SEEDS[:1])


# -- w10-03 ---------------------------------------------------------------------------------------

class StreamPerPassOnSelf(GoodPrefetcher):      # w10-03 w31_stream_per_pass_on_self: zip(p, p) swaps it
    def __iter__(self):
        if self.stream is not None:
            self.stream = torch.cuda.Stream(self.device)
        yield from super().__iter__()


class StreamPerPassLocal(GoodPrefetcher):       # w10-03 w31_stream_per_pass_local_alt (right): a pass's own
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        stream = torch.cuda.Stream(self.device)
        batches = iter(self.loader)

        def copy(batch):
            with torch.cuda.stream(stream):
                return tuple(t.to(self.device, non_blocking=True) for t in batch) if batch is not None else None

        upcoming = copy(next(batches, None))
        while upcoming is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(stream)
            for t in upcoming:
                t.record_stream(consumer)
            batch, upcoming = upcoming, copy(next(batches, None))
            yield batch


class PooledStreamWithTheBatch(GoodPrefetcher):   # right: a stream per batch, kept with the batch it copied
    def copy(self, batch):
        stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream):
            return stream, tuple(t.to(self.device, non_blocking=True) for t in batch)

    def hand_out(self, copied):
        stream, batch = copied
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_stream(stream)
        for t in batch:
            t.record_stream(consumer)
        return batch


class ConsumerAskedOnce(GoodPrefetcher):        # w10-03 w31_consumer_once: current_stream asked in __init__
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self.consumer = torch.cuda.current_stream(self.device) if self.stream is not None else None

    def hand_out(self, batch):
        self.consumer.wait_stream(self.stream)
        for t in batch:
            t.record_stream(self.consumer)
        return batch


MUTANTS_31_W10 = [
    Mutant("w10-03 w31_stream_per_pass_on_self", StreamPerPassOnSelf, "the consumer waits for the copy",
           words="the second pass replaced it"),
    Mutant("w10-03 w31_stream_per_batch (on self)", NewStreamPerBatch, "the consumer waits for the copy",
           words="the second pass replaced it"),
    Mutant("w10-03 w31_consumer_once", ConsumerAskedOnce, "the consumer waits for the copy",
           words="self.consumer wait, a stream asked once, when yours was made"),
]


@pytest.mark.parametrize("mutant", MUTANTS_31_W10, ids=repr)
def test_3_1_w10_mutants(mutant):
    rejected("3.1", mutant, SEEDS[:1])


def test_3_1_w10_a_stream_per_pass_or_per_batch_kept_locally_passes():
    # a pass's own stream in a local variable, or a (pooled) stream per batch handed out with the
    # batch it copied: each batch's wait is on the stream that copied it, also under zip(p, p)
    for answer in (StreamPerPassLocal, PooledStreamWithTheBatch):
        passes("3.1", answer, SEEDS[:1])


def crop_flip_reseeded_when_none(images, padding=4, generator=None):   # w10-03 w32_fixed_seed_when_none
    if generator is None:
        generator = torch.Generator(device=images.device).manual_seed(0)
    return crop_flip(images, padding, generator)


def crop_flip_global_reseed_when_none(images, padding=4, generator=None):   # near miss: torch.manual_seed inside
    if generator is None:
        torch.manual_seed(0)
    return crop_flip(images, padding, generator)


def crop_flip_v2_transforms(images, padding=4, generator=None):   # w10-03 w32_v2_transforms: square, one draw
    import torchvision.transforms.v2 as T2
    h = images.shape[-2]
    return T2.Compose([T2.RandomCrop(h, padding=padding), T2.RandomHorizontalFlip()])(images)


def normalize_times_std(images, labels):         # w10-03 w33_multiply_std
    mean, std = _consts(images.device)
    return (images.float() / 255 - mean) * std, labels


def normalize_mean_std_swapped(images, labels):  # w10-03 w33_mean_std_swapped
    mean, std = _consts(images.device)
    return (images.float() / 255 - std) / mean, labels


def normalize_labels_float(images, labels):      # w10-03 w33_labels_float
    return good_normalize(images, labels)[0], labels.float()


MUTANTS_W10_MESSAGES = [
    ("3.2", Mutant("w10-03 w32_fixed_seed_when_none", crop_flip_reseeded_when_none, "draws new crops on every call",
                   words="seeded alike on every call")),
    ("3.2", Mutant("near miss: torch.manual_seed(0) when generator is None", crop_flip_global_reseed_when_none,
                   "draws new crops on every call", words="or torch.manual_seed, inside the function")),
    ("3.2", Mutant("w10-03 w32_v2_transforms", crop_flip_v2_transforms, "offsets vary across samples, uniformly",
                   words="RandomCrop(H) crops H x H")),
    ("3.3", Mutant("w10-03 w33_multiply_std", normalize_times_std, "equals ToTensor + Normalize",
                   words="yours multiplies by the std")),
    ("3.3", Mutant("w10-03 w33_mean_std_swapped", normalize_mean_std_swapped, "equals ToTensor + Normalize",
                   words="mean and std swapped")),
    ("3.3", Mutant("w10-03 w33_labels_float", normalize_labels_float, "passes the labels through",
                   words="torch.float32, not torch.int64")),
]


@pytest.mark.parametrize("exercise,mutant", MUTANTS_W10_MESSAGES, ids=lambda m: repr(m) if isinstance(m, Mutant) else m)
def test_w10_messages_name_the_mistake(exercise, mutant):
    rejected(exercise, mutant, SEEDS[:1])


def test_3_2_w10_the_distribution_stage_varies_with_the_seed():
    # w10-03: the 20,000 draws with generator=None were the same under every COURSE_CHECK_SEED
    def exclusive(images, padding=4, generator=None):
        dy, dx, flip = _draws(len(images), padding, images.device, generator, high=2 * padding)
        return _crop_with(images, padding, dy, dx, flip)

    import os
    counts = set()
    for seed in (1, 2):
        os.environ["COURSE_CHECK_SEED"] = str(seed)
        try:
            message = run_check("3.2", exclusive).message
        finally:
            os.environ.pop("COURSE_CHECK_SEED", None)
        assert "(counts [" in message, message
        counts.add(message.split("(counts [")[1].split("]")[0])
    assert len(counts) == 2, counts


# -- walk w11-03 ----------------------------------------------------------------------------------

class PinnedStagingBuffer(GoodPrefetcher):      # w11-03 w31_pinned_staging_buffer: passed on seeds 1-8
    """Unpinned batches staged through one pinned buffer per shape, made once and refilled with
    copy_ for every batch: pins memory in the loop, and refills the buffer while the previous
    batch's non-blocking copy from it may still be queued."""
    def copy(self, batch):
        if not hasattr(self, "staging"):
            self.staging = {}
        out = []
        with torch.cuda.stream(self.stream):
            for t in batch:
                if not t.is_pinned():
                    key = (t.shape, t.dtype)
                    if key not in self.staging:
                        self.staging[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    t = self.staging[key].copy_(t)
                out.append(t.to(self.device, non_blocking=True))
        return tuple(out)


class PinnedBufferPerBatch(GoodPrefetcher):     # near miss: a new pinned buffer per batch (no race, but pins in the loop)
    def copy(self, batch):
        with torch.cuda.stream(self.stream):
            return tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t).to(self.device, non_blocking=True)
                         if not t.is_pinned() else t.to(self.device, non_blocking=True) for t in batch)


class CurrentStreamNoDevice(GoodPrefetcher):    # w11-03 w31_no_device_arg: cuda:0's stream waits, cuda:1's reads
    def hand_out(self, batch):
        consumer = torch.cuda.current_stream()
        consumer.wait_stream(self.stream)
        for t in batch:
            t.record_stream(consumer)
        return batch


def crop_flip_fresh_generator(images, padding=4, generator=None):   # w11-03 w32_fresh_generator_default
    generator = generator if generator is not None else torch.Generator(device=images.device)
    return crop_flip(images, padding, generator)


def normalize_per_device_and_shape(images, labels):   # w11-03 w33_expanded_per_shape
    key = (str(images.device), tuple(images.shape))
    if key not in _PER_SHAPE:
        mean, std = (torch.tensor(v, device=images.device).view(1, 3, 1, 1).expand(images.shape).contiguous()
                     for v in (CIFAR10_MEAN, CIFAR10_STD))
        _PER_SHAPE[key] = mean, std
    mean, std = _PER_SHAPE[key]
    return (images.float() / 255 - mean) / std, labels


_PER_SHAPE = {}


def normalize_float16_constants(images, labels):      # w11-03 w33_scale_float16_consts
    mean, std = _consts(images.device)
    scale, shift = (1 / (255 * std)).half(), (-mean / std).half()
    return torch.addcmul(shift.float(), images.float(), scale.float()), labels


MUTANTS_W11 = [
    ("3.1", Mutant("w11-03 w31_pinned_staging_buffer", PinnedStagingBuffer,
                   "leaves pinned memory alone while a copy from it is queued",
                   words="a pinned buffer kept between batches (a staging buffer)")),
    ("3.1", Mutant("near miss: a new pinned buffer per unpinned batch", PinnedBufferPerBatch,
                   "pins nothing in the training loop", words="allocated pinned memory")),
    ("3.1", Mutant("w11-03 w31_no_device_arg", CurrentStreamNoDevice, "the consumer waits for the copy",
                   words="torch.cuda.current_stream() without a device is the current device's stream")),
    ("3.2", Mutant("w11-03 w32_fresh_generator_default", crop_flip_fresh_generator, "draws new crops on every call",
                   words="yours makes a new torch.Generator in every call")),
    ("3.3", Mutant("w11-03 w33_expanded_per_shape", normalize_per_device_and_shape,
                   "makes no copy from the host after the first batch", words="per (device, shape)")),
    ("3.3", Mutant("w11-03 w33_scale_float16_consts", normalize_float16_constants, "equals ToTensor + Normalize",
                   words="its constants were stored as float16")),
]


@pytest.mark.parametrize("exercise,mutant", MUTANTS_W11, ids=lambda m: repr(m) if isinstance(m, Mutant) else m)
def test_w11_mutants_named(exercise, mutant):
    rejected(exercise, mutant, SEEDS[:1])


def test_3_1_w11_staging_buffer_fails_on_every_seed():
    # the race is in every seed's draw: batches 0 and 1 of each pass share a shape
    rejected("3.1", MUTANTS_W11[0][1], SEEDS[1:4])


class DotCudaStreamPerPass(GoodPrefetcher):     # w11-03 w31_dot_cuda + w31_stream_per_pass_on_self (right)
    def __iter__(self):
        if self.stream is None:
            yield from super().__iter__()
            return
        self.stream = torch.cuda.Stream(self.device)     # a fresh stream per pass, kept on self
        stream = self.stream                             # ... but the pass uses its own local copy
        batches = iter(self.loader)

        def copy(batch):                                 # .cuda(): the stream's device is current in the block
            with torch.cuda.stream(stream):
                return tuple(t.cuda(non_blocking=True) for t in batch) if batch is not None else None

        upcoming = copy(next(batches, None))
        while upcoming is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(stream)
            for t in upcoming:
                t.record_stream(consumer)
            batch, upcoming = upcoming, copy(next(batches, None))
            yield batch


def crop_flip_unfold_rand_le(images, padding=4, generator=None):   # w11-03 w32_unfold_windows + w32_flip_rand_le
    n, c, h, w = images.shape
    dev = images.device
    dy = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=dev, generator=generator)
    flip = torch.rand(n, device=dev, generator=generator) <= 0.5
    win = F.pad(images, (padding,) * 4).unfold(2, h, 1).unfold(3, w, 1)     # a view: (N, C, k, k, H, W)
    out = win[torch.arange(n, device=dev), :, dy, dx].contiguous()
    return torch.where(flip.view(n, 1, 1, 1), out.flip(-1), out)


def normalize_labels_moved_and_long(images, labels):   # w11-03 w33_labels_to_device + w33_labels_long
    return good_normalize(images, labels)[0], labels.to(images.device).long()


def test_w11_right_answers_of_the_report_pass():
    # right by the contract: .cuda() inside `with torch.cuda.stream(stream)` goes to the stream's
    # device; a stream per pass used through a local name; `<= 0.5` has the same distribution;
    # an unfold view picks one window per sample; labels already int64 on the device are unchanged
    passes("3.1", DotCudaStreamPerPass, SEEDS[:1])
    passes("3.2", crop_flip_unfold_rand_le, SEEDS[:1])
    passes("3.3", normalize_labels_moved_and_long, SEEDS[:1])


# -- walk w12-03 ----------------------------------------------------------------------------------

class WaitsOncePerPass(GoodPrefetcher):         # w12-03 w31_wait_first_only: no event, one wait per pass
    def __iter__(self):
        self.first = True
        yield from super().__iter__()

    def hand_out(self, batch):
        consumer = torch.cuda.current_stream(self.device)
        if self.first:
            consumer.wait_stream(self.stream)
            self.first = False
        for t in batch:
            t.record_stream(consumer)
        return batch


class LabelsLeftOnHost(GoodPrefetcher):         # w12-03 w31_images_only_moved: record_stream on host labels
    def copy(self, batch):
        images, labels = batch
        with torch.cuda.stream(self.stream):
            return images.to(self.device, non_blocking=True), labels


def _crop_flip_drawn(draw):
    """A crop and flip whose draws come from `draw(n, padding, device, generator)`."""
    def random_crop_flip(images, padding=4, generator=None):
        dy, dx, flip = draw(len(images), padding, images.device, generator)
        return _crop_with(images, padding, dy, dx, flip)
    return random_crop_flip


def _flip_rate_of(p):
    def draw(n, padding, device, generator):
        dy, dx, _ = _draws(n, padding, device, generator)
        return dy, dx, torch.rand(n, device=device, generator=generator) < p
    return draw


def _rarely_skip(n, padding, device, generator):       # w12-03 w32b: 0.5 * 0.97 = 0.485
    dy, dx, flip = _draws(n, padding, device, generator)
    return dy, dx, flip & (torch.rand(n, device=device, generator=generator) < 0.97)


def _half_reused(which):
    """w12-03 w32c/w32d: draws for half the batch, repeated for the second half (.repeat(2))."""
    def draw(n, padding, device, generator):
        dy, dx, flip = _draws(n, padding, device, generator)
        m = (n + 1) // 2
        half = dict(zip("dy dx flip".split(), _draws(m, padding, device, generator)))
        if "dy" in which:
            dy = half["dy"].repeat(2)[:n]
        if "dx" in which:
            dx = half["dx"].repeat(2)[:n]
        if "flip" in which:
            flip = half["flip"].repeat(2)[:n]
        return dy, dx, flip
    return draw


def _flips_mirrored_halves(n, padding, device, generator):   # near miss: sample n-1-i copies sample i's flip
    dy, dx, flip = _draws(n, padding, device, generator)
    m = (n + 1) // 2
    return dy, dx, torch.cat([flip[:m], flip[:n - m].flip(0)])


def _flips_negated_halves(n, padding, device, generator):       # near miss: the second half's flips negate the first's
    dy, dx, flip = _draws(n, padding, device, generator)
    m = n // 2
    return dy, dx, torch.cat([flip[:m], ~flip[:m], flip[2 * m:]])


BIASED = "a biased flip rate"
NOT_INDEPENDENT = "the samples' crops/flips are not independent"
MUTANTS_32_W12 = [
    Mutant("w12-03 w32_flip_p049", _crop_flip_drawn(_flip_rate_of(0.49)), "flips half the samples",
           words=BIASED),
    Mutant("w12-03 w32_flip_p0485", _crop_flip_drawn(_flip_rate_of(0.485)), "flips half the samples",
           words=BIASED),
    Mutant("w12-03 w32_flip_p048", _crop_flip_drawn(_flip_rate_of(0.48)), "flips half the samples",
           words=BIASED),
    Mutant("near miss: flip rate 0.52", _crop_flip_drawn(_flip_rate_of(0.52)), "flips half the samples",
           words=BIASED),
    Mutant("w12-03 w32b 'rarely skip the flip' (0.485)", _crop_flip_drawn(_rarely_skip),
           "flips half the samples", words=BIASED),
    Mutant("w12-03 w32c_half_batch_offsets_repeated", _crop_flip_drawn(_half_reused(("dy", "dx", "flip"))),
           "draws each sample independently of the others", words="offset of sample i + 10,000 equals that of sample i"),
    Mutant("w12-03 w32d_flips_repeated_halves", _crop_flip_drawn(_half_reused(("flip",))),
           "draws each sample independently of the others",
           words="the flip of sample i + 10,000 equals that of sample i in 10,000 of the 10,000 pairs"),
    Mutant("w12-03 w32d_dx_repeated_halves", _crop_flip_drawn(_half_reused(("dx",))),
           "draws each sample independently of the others",
           words="the horizontal offset of sample i + 10,000 equals"),
    Mutant("near miss: the second half's flips negate the first half's", _crop_flip_drawn(_flips_negated_halves),
           "draws each sample independently of the others", words="is made from the draw of sample i"),
    Mutant("near miss: the flips of the second half mirror the first half's", _crop_flip_drawn(_flips_mirrored_halves),
           "draws each sample independently of the others", words=NOT_INDEPENDENT),
]


@pytest.mark.parametrize("mutant", MUTANTS_32_W12, ids=repr)
def test_3_2_w12_mutants_rejected(mutant):
    rejected("3.2", mutant, SEEDS[:1])


def _judged(draw, seed, *, lags=True):
    """The check's verdicts on a mutant's draws for a batch of the check's sizes (the stages that
    read them from the crops are the full check's, run once per mutant above): the flip rate over
    FLIP_N samples, the agreement at every lag over 20,000."""
    from course_utils.checks import lesson03 as L
    g = torch.Generator().manual_seed(seed)
    L._judge_flip_rate(draw(L.FLIP_N, 1, "cpu", g)[2], f"seed {seed}")
    if not lags:
        return
    dy, dx, flip = draw(20_000, 4, "cpu", g)
    for values, kk, name in ((dy, 9, "vertical offset"), (dx, 9, "horizontal offset"), (flip.long(), 2, "flip")):
        L._lag_agreement(values, kk, name, f"seed {seed}")


STAT_SEEDS = range(40)     # the flip rate's verdict (cheap); the lags' on the first 8 (each ~0.1 s a draw)


@pytest.mark.parametrize("draw,words", [
    (_flip_rate_of(0.485), BIASED), (_flip_rate_of(0.48), BIASED), (_flip_rate_of(0.515), BIASED),
    (_rarely_skip, BIASED),
    (_half_reused(("dy", "dx", "flip")), NOT_INDEPENDENT), (_half_reused(("flip",)), NOT_INDEPENDENT),
    (_half_reused(("dx",)), NOT_INDEPENDENT),
], ids=["p0485", "p048", "p0515", "rarely_skip", "half_all", "half_flips", "half_dx"])
def test_3_2_w12_statistics_reject_on_every_seed(draw, words):
    # w12-03: 0.485, 0.48 and the half-batch reuses passed or failed by the seed; now each is
    # rejected on each of 40 seeds (biased rates by 8 standard deviations or more; reuse, z over 100, on 8)
    from course_utils.checks._core import CheckFailed
    seeds = STAT_SEEDS if words == BIASED else STAT_SEEDS[:8]
    for seed in seeds:
        with pytest.raises(CheckFailed) as failed:
            _judged(draw, seed)
        assert words in failed.value.sentence(), (seed, failed.value.sentence())


def test_3_2_w12_statistics_pass_the_right_answer_on_every_seed():
    # false rejection: about 1e-7 per stage (band 5.4 standard deviations, lags at 7.5)
    for seed in STAT_SEEDS:
        _judged(_draws, seed, lags=seed < 8)


def test_3_2_w12_any_fixed_pairing_in_a_batch_is_caught_per_position():
    # the mirrored halves pair sample i with sample 15 - i: no lag, but the same pair in every call
    import numpy as np
    from course_utils.checks import lesson03 as L
    from course_utils.checks._core import CheckFailed
    images = (torch.arange(144, dtype=torch.float32) + 1).view(1, 1, 12, 12).expand(16, 1, 12, 12).contiguous()

    def generator(s):
        return torch.Generator().manual_seed(int(s))
    for seed in range(3):
        L._per_position(crop_flip, images, generator, np.random.default_rng(seed), "cpu", seed, None, 12, 4)
        with pytest.raises(CheckFailed) as failed:
            L._per_position(_crop_flip_drawn(_flips_mirrored_halves), images, generator, np.random.default_rng(seed),
                            "cpu", seed, None, 12, 4)
        assert NOT_INDEPENDENT in failed.value.sentence(), failed.value.sentence()


def test_3_2_w12_flip_rate_band_is_the_documented_resolution():
    from course_utils.checks import lesson03 as L
    sd = 0.5 / L.FLIP_N ** 0.5
    assert L.FLIP_BAND / sd > 5.3                          # a fair coin: outside with probability < 1e-7
    assert (0.5 - 0.488 - L.FLIP_BAND) / sd > 4.75         # 0.488 (and further) fails with probability > 1 - 1e-6
    assert L.FLIP_BAND <= 0.015


def normalize_eps(eps, folded=False):
    def normalize_on_device(images, labels):
        mean, std = _consts(images.device)
        if folded:
            return torch.addcmul(-mean / (std + eps), images.float(), 1 / (255 * (std + eps))), labels
        return (images.float() / 255 - mean) / (std + eps), labels
    normalize_on_device.__name__ = f"normalize_eps_{eps:g}{'_folded' if folded else ''}"
    return normalize_on_device


_FOLDED = {}


def normalize_folded(images, labels):            # the folded form, constants in float32 made once: within 4e-6
    key = str(images.device)
    if key not in _FOLDED:
        mean, std = _consts(images.device)
        _FOLDED[key] = (1 / (255 * std), -mean / std)
    scale, shift = _FOLDED[key]
    return torch.addcmul(shift, images, scale), labels


MUTANTS_W12_OTHER = [
    ("3.1", Mutant("w12-03 w31_wait_first_only", WaitsOncePerPass, "the consumer waits for the copy",
                   words="wait for your side stream 1 time(s) in all")),
    ("3.1", Mutant("w12-03 w31_images_only_moved", LabelsLeftOnHost, "copies every batch to the device",
                   words="the labels were never copied to the device")),
    ("3.3", Mutant("w12-03 w33b_eps_1e-5", normalize_eps(1e-5), "equals ToTensor + Normalize",
                   words="yours divides by std + 1e-05")),
    ("3.3", Mutant("w12-03 w33b_eps_in_place_const", normalize_eps(1e-5, folded=True), "equals ToTensor + Normalize",
                   words="yours divides by std + 1e-05")),
]


@pytest.mark.parametrize("exercise,mutant", MUTANTS_W12_OTHER, ids=lambda m: repr(m) if isinstance(m, Mutant) else m)
def test_w12_mutants_rejected(exercise, mutant):
    rejected(exercise, mutant, SEEDS[:2])


def test_3_3_w12_folded_constants_pass():
    passes("3.3", normalize_folded, SEEDS[:2])


def test_3_3_w12_tolerance_fits_float32_rounding_not_an_epsilon():
    # every pixel value, every channel: a right answer's float32 forms within 4.8e-7, an epsilon of
    # 1e-5 off by 8.7e-5 (and by more than the tolerance wherever |value| > 0.11)
    import numpy as np
    from course_utils.checks import lesson03 as L
    v = np.arange(256, dtype=np.uint8)
    hwc = np.stack([v, v, v], -1)[None, :, None, :]
    expected = L._reference_normalize(hwc)
    images = torch.from_numpy(hwc).permute(0, 3, 1, 2).contiguous()
    labels = torch.zeros(1, dtype=torch.int64)
    for right in (good_normalize, normalize_folded):
        assert float((right(images, labels)[0] - expected).abs().max()) < L.NORMALIZE_TOL / 4
    wrong = (normalize_eps(1e-5)(images, labels)[0] - expected).abs()
    assert bool((wrong[expected.abs() > 0.15] > L.NORMALIZE_TOL).all())
