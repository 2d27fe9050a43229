"""Lesson 04's checks: correct pipelines pass, typical mistakes fail on the right property,
stubs are 'not implemented', and without DALI every check says so in one sentence."""
import os

import numpy as np
import pytest

from course_utils import data
from course_utils.checks import lesson04, run_check
from course_utils.env import local_cuda_index
from mutants import Mutant, passes, rejected

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed: lesson 04's checks cannot run")

from nvidia.dali import fn, pipeline_def, types  # noqa: E402
from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: E402

from course_utils import dali_pipelines  # noqa: E402

pytestmark = pytest.mark.dali

CIFAR_MEAN255 = [255 * m for m in data.CIFAR10_MEAN]
CIFAR_STD255 = [255 * s for s in data.CIFAR10_STD]
NET_MEAN255 = [255 * m for m in dali_pipelines.IMAGENET_MEAN]
NET_STD255 = [255 * s for s in dali_pipelines.IMAGENET_STD]
NINE = [k / 8 for k in range(9)]


@pytest.fixture(autouse=True)
def fixed_seed(monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_SEED", "2404")


@pytest.fixture(scope="module")
def _folders(tmp_path_factory):
    return tmp_path_factory, {}


@pytest.fixture(autouse=True)
def reuse_jpeg_folders(monkeypatch, _folders):
    """Check 4.3 writes ~3,000 JPEGs for every run; the tests run it on the same few seeds many
    times, so each seed's folder is written once and handed out again, with the generator moved
    on exactly as writing it would have (the check sees the same folder and the same draws)."""
    factory, cache = _folders
    real = lesson04._jpeg_folder

    def cached(rng, root, batch_size):
        key = (repr(rng.bit_generator.state), batch_size)
        if key not in cache:
            folder = real(rng, factory.mktemp("jpegs"), batch_size)
            cache[key] = (folder, rng.bit_generator.state)
        folder, state = cache[key]
        rng.bit_generator.state = state
        return folder

    monkeypatch.setattr(lesson04, "_jpeg_folder", cached)


# -- 4.1 ----------------------------------------------------------------------------------------

def this_gpu(device, fixed=None):
    """The device_id a right answer gives DALI: this process's GPU (LOCAL_RANK under torchrun)."""
    if device != "gpu":
        return None
    return fixed if fixed is not None else local_cuda_index()


def make_cifar_pipeline(*, mean=CIFAR_MEAN255, std=CIFAR_STD255, positions="nine", mirror=True, layout="CHW",
                        pad_first=True, pad=True, swap_outputs=False, flip_probability=0.5, fixed_seed=None,
                        shared_offset=False, label_dtype=None, device_id=None, vertical_flip=False, move="before",
                        threads=None, pipe_kw=None, prebuilt=False, flip_from_x=False, seed_offset=0,
                        mirror_kind="coin", flip_after=False, positions_range9=False, fill=0, batch_info=True,
                        crop_op_seed=None, zero_seed_random=False, flip_op_seed=None, per_sample=False,
                        rounded_range=None, seed_plus_threads=False, index_dtype=None):
    """A CIFAR pipeline builder with one knob per typical mistake (the defaults are right).
    `move`: where a device="gpu" pipeline moves the images to the GPU: "before" the crop (right),
    "after" the augmentation, or "never". `device_id="none"`: None whatever the device; "current":
    torch.cuda.current_device() (w6-04 w41_22). `pad="end36"`: fn.pad to 36x36, 4 pixels at the bottom
    and right only (w6-04 w41_21). `crop_op_seed`: the crop positions' operators seeded with it
    (w6-04 w41_31); `zero_seed_random`: `seed if seed else None` (w6-04 w41_26). `threads="floor2"`:
    max(num_threads, 2) (w10-04 w41_31); `rounded_range=(lo, hi)`: each offset cast (rounded) to an
    integer from uniform(range=[lo, hi]) (w10-04 w41_22, w41_23); `seed_plus_threads`: seed +
    num_threads (w10-04 w41_16)."""
    def cifar_pipeline(source, batch_size, device="cpu", num_threads=2, seed=0):
        import torch
        pipe_seed = (seed if fixed_seed is None else fixed_seed) + seed_offset + (num_threads if seed_plus_threads else 0)
        if threads == "floor2":
            num_threads = max(num_threads, 2)
        if zero_seed_random:
            pipe_seed = seed if seed else None

        @pipeline_def(batch_size=batch_size, num_threads=(os.cpu_count() if threads == "cores" else None
                                                          if threads == "floor2" else threads) or num_threads,
                      device_id=None if device_id == "none" else local_cuda_index() if device_id == "always"
                      else (torch.cuda.current_device() if device == "gpu" else None) if device_id == "current"
                      else this_gpu(device, device_id),
                      seed=pipe_seed, **(pipe_kw or {}))
        def graph():
            images, labels, indices = fn.external_source(
                source=source, num_outputs=3, batch=not per_sample, batch_info=batch_info and not per_sample,
                layout=["CHW", "", ""], dtype=[types.UINT8, types.INT64, types.INT64])
            if device == "gpu" and move == "before":
                images = images.gpu()
            norm = dict(mean=mean, std=std)
            if not pad_first:   # normalise, then pad with 0 (the mean colour), then crop
                images = fn.crop_mirror_normalize(images, mean=mean, std=std, dtype=types.FLOAT, output_layout="CHW")
                norm = dict(mean=[0.0] * 3, std=[1.0] * 3)
            if pad == "end":                 # w3-04: fn.pad puts its padding after the image
                images = fn.pad(images, axis_names="HW", shape=(40, 40), fill_value=fill)
            elif pad == "end36":             # w6-04 w41_21: 4 pixels at the bottom and right only
                images = fn.pad(images, axis_names="HW", shape=(36, 36), fill_value=fill)
            elif pad:
                images = fn.crop(images, crop=(40, 40), out_of_bounds_policy="pad", fill_values=fill)
            if positions == "nine" and crop_op_seed is not None:
                pos_y, pos_x = (fn.random.uniform(values=NINE, seed=crop_op_seed),
                                fn.random.uniform(values=NINE, seed=crop_op_seed + 1))
            elif positions == "nine":
                pos_y, pos_x = fn.random.uniform(values=NINE), fn.random.uniform(values=NINE)
            elif positions == "eight":       # offsets 0..7: one short
                pos_y, pos_x = fn.random.uniform(values=NINE[:8]), fn.random.uniform(values=NINE[:8])
            elif positions == "int_range":   # an integer 0..8 rounded from a continuous draw, then / 8 (w1-04 4.1 #2)
                pos_y, pos_x = (fn.random.uniform(range=[0, 8], dtype=types.INT32) / 8.0,
                                fn.random.uniform(range=[0, 8], dtype=types.INT32) / 8.0)
            elif positions in ("choice", "choice_skewed"):   # w3-04: fn.random.choice, uniform or p(0)=0.10
                p = None if positions == "choice" else [0.10] + [0.1125] * 8
                pos_y, pos_x = (fn.random.choice(NINE, p=p), fn.random.choice(NINE, p=p)) if p else \
                    (fn.random.choice(NINE), fn.random.choice(NINE))
            elif positions == "centre_x":    # w5-04 w22: crop_pos_x=0.5 fixed, y random
                pos_y, pos_x = fn.random.uniform(values=NINE), 0.5
            else:
                pos_y, pos_x = fn.random.uniform(range=[0.0, 1.0]), fn.random.uniform(range=[0.0, 1.0])
            if rounded_range is not None:    # w10-04: cast(cast(uniform(range), INT32), FLOAT) / 8
                pos_y, pos_x = (fn.cast(fn.cast(fn.random.uniform(range=list(rounded_range)), dtype=types.INT32),
                                        dtype=types.FLOAT) / 8.0 for _ in range(2))
            if positions_range9:             # integers 0..9 from range=[0, 9], / 8: an anchor past 1 (w2-04 w41_28)
                pos_y, pos_x = (fn.random.uniform(range=[0, 9], dtype=types.INT32) / 8.0,
                                fn.random.uniform(range=[0, 9], dtype=types.INT32) / 8.0)
            if shared_offset:                # one draw for both axes
                pos_x = pos_y
            flip = fn.random.coin_flip(probability=flip_probability) if mirror and not vertical_flip else 0
            if flip_op_seed is not None:     # the near-miss rule: the flips' operator seeded, the crops not
                flip = fn.random.coin_flip(probability=flip_probability, seed=flip_op_seed)
            if isinstance(mirror_kind, tuple) and mirror_kind[0] != "shift":   # w3-04: uniform() vs a constant
                side, c = mirror_kind
                u = fn.random.uniform(range=[0.0, 1.0])
                flip = fn.cast(u < c if side == "lt" else c > u, dtype=types.INT32)
            if isinstance(mirror_kind, tuple) and mirror_kind[0] == "shift":   # w11-04 y01: u + c > 0.5
                flip = fn.cast(fn.random.uniform(range=[0, 1]) + mirror_kind[1] > 0.5, dtype=types.INT32)
            if mirror_kind == "uniform01":   # 0 or 1 with probability 1/2 each, not a coin (w2-04 w41_16: right)
                flip = fn.cast(fn.random.uniform(values=[0.0, 1.0]), dtype=types.INT32)
            if flip_after:                   # no mirror in CMN, fn.flip after it (w2-04 w41_29: right)
                flip = 0
            if flip_from_x:                  # the flip decided by the crop: x > 0.5 (or x == 0.5 and a coin)
                coin = fn.random.coin_flip(probability=0.5)
                flip = fn.cast((pos_x > 0.5) | ((pos_x == 0.5) & (coin == 1)), dtype=types.INT32) \
                    if flip_from_x == "fair" else fn.cast(pos_x > 0.5, dtype=types.INT32)
            out = fn.crop_mirror_normalize(images, crop=(32, 32), crop_pos_y=pos_y, crop_pos_x=pos_x, mirror=flip,
                                           dtype=types.FLOAT, output_layout=layout, **norm)
            if vertical_flip:
                out = fn.flip(out, horizontal=0, vertical=fn.random.coin_flip(probability=flip_probability))
            if flip_after:
                out = fn.flip(out, horizontal=fn.random.coin_flip(probability=0.5), vertical=0)
            if label_dtype is not None:
                labels = fn.cast(labels, dtype=getattr(types, label_dtype))
            if index_dtype is not None:      # w11-04 x11: the indices cast to UINT32
                indices = fn.cast(indices, dtype=getattr(types, index_dtype))
            if device == "gpu" and move == "after":
                out = out.gpu()
            if swap_outputs:
                return out, indices, labels
            return out, labels, indices
        pipe = graph()
        if prebuilt:
            pipe.build()
        return pipe
    return cifar_pipeline


def per_batch_offsets(source, batch_size, device="cpu", num_threads=2, seed=0):
    """One crop offset per batch, drawn in Python (w1-04 4.1 #31)."""
    rng = np.random.default_rng(seed)

    def pos(info):
        return [np.array(rng.integers(0, 9) / 8, np.float32)] * batch_size

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed)
    def graph():
        images, labels, indices = fn.external_source(source=source, num_outputs=3, batch=True, batch_info=True,
                                                     layout=["CHW", "", ""], dtype=[types.UINT8, types.INT64, types.INT64])
        py = fn.external_source(source=pos, batch=True, batch_info=True, dtype=types.FLOAT)
        px = fn.external_source(source=pos, batch=True, batch_info=True, dtype=types.FLOAT)
        if device == "gpu":
            images = images.gpu()
        padded = fn.crop(images, crop=(40, 40), out_of_bounds_policy="pad", fill_values=0)
        out = fn.crop_mirror_normalize(padded, crop=(32, 32), crop_pos_y=py, crop_pos_x=px,
                                       mirror=fn.random.coin_flip(probability=0.5), mean=CIFAR_MEAN255, std=CIFAR_STD255,
                                       dtype=types.FLOAT, output_layout="CHW")
        return out, labels, indices
    return graph()


def python_function_flip(source, batch_size, device="cpu", num_threads=2, seed=0):
    """w7-04 41_python_function_flip: right outputs, the coin cast in a Python callback (2.3x slower)."""
    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed)
    def pipe():
        images, labels, indices = fn.external_source(source=source, num_outputs=3, batch=True, batch_info=True,
                                                     layout=["CHW", "", ""],
                                                     dtype=[types.UINT8, types.INT64, types.INT64])
        if device == "gpu":
            images = images.gpu()
        images = fn.crop(images, crop=(40, 40), out_of_bounds_policy="pad", fill_values=0)
        images = fn.crop_mirror_normalize(
            images, crop=(32, 32), crop_pos_y=fn.random.uniform(values=NINE), crop_pos_x=fn.random.uniform(values=NINE),
            mirror=fn.python_function(fn.random.coin_flip(probability=0.5), function=lambda c: c.astype("int32")),
            mean=CIFAR_MEAN255, std=CIFAR_STD255, dtype=types.FLOAT, output_layout="CHW")
        return images, labels, indices
    return pipe()


def python_augmentation(source, batch_size, device="cpu", num_threads=2, seed=0):
    """The whole augmentation in NumPy, per sample, inside a source of its own around `source`;
    DALI only passes float32 through (w1-04 4.1 #32: right, and the cost DALI removes)."""
    rng = np.random.default_rng(seed)
    mean = np.array(data.CIFAR10_MEAN, np.float32).reshape(3, 1, 1)
    std = np.array(data.CIFAR10_STD, np.float32).reshape(3, 1, 1)

    def augmented(info):
        images, labels, idx = source(info)
        out = []
        for im in images:
            padded = np.zeros((3, 40, 40), np.uint8)
            padded[:, 4:36, 4:36] = im
            y, x = rng.integers(0, 9, 2)
            window = padded[:, y:y + 32, x:x + 32]
            if rng.random() < 0.5:
                window = window[:, :, ::-1]
            out.append(((window / 255.0 - mean) / std).astype(np.float32))
        return np.stack(out), labels, idx

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed)
    def graph():
        images, labels, indices = fn.external_source(source=augmented, num_outputs=3, batch=True, batch_info=True,
                                                     layout=["CHW", "", ""], dtype=[types.FLOAT, types.INT64, types.INT64])
        if device == "gpu":
            images = images.gpu()
        return images, labels, indices
    return graph()


_kept = {}


def kept_between_calls(source, batch_size, device="cpu", num_threads=2, seed=0):
    """The first pipeline built, kept at module level and returned again (w1-04 4.1 #30)."""
    if "pipe" not in _kept:
        _kept["pipe"] = make_cifar_pipeline()(source, batch_size, device, num_threads, seed)
    return _kept["pipe"]


def padded_by_slices(source, batch_size, device="cpu", num_threads=2, seed=0):
    """A right answer another way: fn.slice pads and crops at integer offsets (w1-04 4.1)."""
    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed)
    def graph():
        images, labels, indices = fn.external_source(source=source, num_outputs=3, batch=True, batch_info=True,
                                                     layout=["CHW", "", ""], dtype=[types.UINT8, types.INT64, types.INT64])
        if device == "gpu":
            images = images.gpu()
        py = fn.random.uniform(values=list(range(9)), dtype=types.INT32)
        px = fn.random.uniform(values=list(range(9)), dtype=types.INT32)
        padded = fn.slice(images, start=[-4, -4], shape=[40, 40], axes=[1, 2], out_of_bounds_policy="pad")
        window = fn.slice(padded, fn.stack(py, px), [32, 32], axes=[1, 2], normalized_anchor=False,
                          normalized_shape=False)
        out = fn.crop_mirror_normalize(window, mirror=fn.random.coin_flip(), mean=CIFAR_MEAN255, std=CIFAR_STD255,
                                       dtype=types.FLOAT, output_layout="CHW")
        return out, labels, indices
    return graph()



def the_course_pipeline(source, batch_size, device="cpu", num_threads=2, seed=0):
    return dali_pipelines.cifar_train_pipeline(source, batch_size=batch_size, device=device,
                                               num_threads=num_threads, seed=seed)


MUTANTS_41 = [
    Mutant("no normalisation", make_cifar_pipeline(mean=[0.0] * 3, std=[1.0] * 3),
           "each sample is an exact crop of its padded record, normalised", words="0..255"),
    Mutant("normalised, then padded", make_cifar_pipeline(pad_first=False),
           "each sample is an exact crop of its padded record, normalised", words="not black"),
    Mutant("ImageNet's constants", make_cifar_pipeline(mean=NET_MEAN255, std=NET_STD255),
           "each sample is an exact crop of its padded record, normalised", words="ImageNet"),
    Mutant("continuous crop positions", make_cifar_pipeline(positions="continuous"),
           "crop offsets are uniform over 0..8", words="half as often"),
    Mutant("no mirror", make_cifar_pipeline(mirror=False), "flips half of the samples", words="coin_flip"),
    Mutant("mirrors 30%", make_cifar_pipeline(flip_probability=0.3), "flips half of the samples"),
    Mutant("HWC", make_cifar_pipeline(layout="HWC"), "images are (B, 3, 32, 32)", words="HWC"),
    Mutant("no padding", make_cifar_pipeline(pad=False), "crop offsets cover 0..8", words="pad 4"),
    Mutant("outputs swapped", make_cifar_pipeline(swap_outputs=True), "indices pass through unchanged"),
    Mutant("a seed of its own", make_cifar_pipeline(fixed_seed=1234), "follows the seed"),
    Mutant("the course's pipeline", the_course_pipeline, "is your own code"),
    # issue 28 / 21: wrong answers that passed
    Mutant("labels cast to int32", make_cifar_pipeline(label_dtype="INT32"), "labels and indices stay int64",
           words="cross_entropy"),
    Mutant("one offset for both axes", make_cifar_pipeline(shared_offset=True), "draws the two offsets independently",
           words="diagonal"),
    Mutant("flips 45%", make_cifar_pipeline(flip_probability=0.45), "flips half of the samples"),
    Mutant("flips 55%", make_cifar_pipeline(flip_probability=0.55), "flips half of the samples"),
    Mutant("device_id=0 on every GPU", make_cifar_pipeline(device_id=0), "runs on this process's GPU",
           words="local_cuda_index"),
    # and more of the same family
    Mutant("offsets 0..7", make_cifar_pipeline(positions="eight"), "crop offsets cover 0..8"),
    Mutant("flips vertically", make_cifar_pipeline(vertical_flip=True),       # w2-04: the headline names it too
           "each sample is an exact crop of its padded record, normalised", words="upside down"),
    Mutant("labels cast to float", make_cifar_pipeline(label_dtype="FLOAT"), "labels and indices stay int64"),
]

# issue 37: the wrong answers of a learner's walk (w1-04) and an expert's review (x-04) that passed, or
# failed with a message that pointed elsewhere. Where the work runs, the coin's probability, the threads
# and the prefetching are read from the pipeline's graph: the same verdict on every seed, so one seed each.
MUTANTS_41_WALK = [
    # w9-04 w41_33: batch=False took the source's (B, 3, 32, 32) batch as one sample; DALI's "The layout
    # 'CHW' cannot describe 4-dimensional data" sent the learner to layout=
    Mutant("a per-sample external source (batch=False, w9-04)", make_cifar_pipeline(per_sample=True),
           "the source gives whole batches", words="batch=False"),
    Mutant("the coin cast in fn.python_function (w7-04)", python_function_flip, "no Python inside the pipeline",
           words="PythonFunction"),
    Mutant("never moves the images to the GPU", make_cifar_pipeline(move="never"),
           "device='gpu' augments on this process's GPU", words="never reach the GPU"),
    Mutant("augments on the CPU, copies the result", make_cifar_pipeline(move="after"),
           "device='gpu' augments on this process's GPU", words="copied to the GPU afterwards"),
    Mutant("device ignored (device_id=None, no .gpu())", make_cifar_pipeline(move="never", device_id="none"),
           "device='gpu' augments on this process's GPU", words="never reach the GPU"),
    Mutant("the augmentation in NumPy inside the source", python_augmentation, "hands the source to DALI as it is",
           words="Python work per sample"),
    Mutant("a pipeline kept between calls", kept_between_calls, "builds a new pipeline on every call",
           words="kept between calls"),
    Mutant("one thread, whatever it is given", make_cifar_pipeline(threads=1), "uses the threads it is given",
           words=f"num_threads={lesson04._threads()}"),
    # w2-04 w41_14: the signature's default, 2, whatever it is given (passed on a 2-core machine)
    Mutant("two threads, whatever it is given", make_cifar_pipeline(threads=2), "uses the threads it is given",
           words="your pipeline runs 2"),
    Mutant("all the cores, whatever it is given", make_cifar_pipeline(threads="cores"), "uses the threads it is given",
           words=f"your pipeline runs {os.cpu_count()}"),
    Mutant("offsets from range=[0, 9] / 8 (DALI's anchor error, translated: w7-04)",
           make_cifar_pipeline(positions_range9=True), "crop offsets cover 0..8", words="a fraction of the slack"),
    Mutant("prefetching off", make_cifar_pipeline(pipe_kw=dict(prefetch_queue_depth=1, exec_async=False,
                                                                 exec_pipelined=False)),
           "keeps DALI's prefetching", words="exec_async=False"),
    Mutant("flips 47%", make_cifar_pipeline(flip_probability=0.47), "flips half of the samples", words="probability=0.47"),
    Mutant("flips 48%", make_cifar_pipeline(flip_probability=0.48), "flips half of the samples", words="probability=0.48"),
    Mutant("flips 52%", make_cifar_pipeline(flip_probability=0.52), "flips half of the samples", words="probability=0.52"),
    Mutant("flips 53%", make_cifar_pipeline(flip_probability=0.53), "flips half of the samples", words="probability=0.53"),
    Mutant("the flip decided by the crop", make_cifar_pipeline(flip_from_x=True), "draws the flip independently of the crop",
           words="horizontal offset"),
    Mutant("the flip decided by the crop, 50% overall", make_cifar_pipeline(flip_from_x="fair"),
           "draws the flip independently of the crop", words="horizontal offset"),
    Mutant("integer offsets from range=[0, 8]", make_cifar_pipeline(positions="int_range"),
           "crop offsets are uniform over 0..8", words="range=[0, 8], dtype=INT32"),
    Mutant("one offset per batch", per_batch_offsets, "each sample draws its own crop and flip", words="once per batch"),
    Mutant("mean and std in 0..1 units", make_cifar_pipeline(mean=list(data.CIFAR10_MEAN), std=list(data.CIFAR10_STD)),
           "each sample is an exact crop of its padded record, normalised", words="0..1 units"),
    Mutant("std of 1", make_cifar_pipeline(std=[1.0] * 3),
           "each sample is an exact crop of its padded record, normalised", words="nothing is divided"),
    # w3-04: flips and offsets that are not a coin_flip, read from the graph on every seed; device_id=None
    Mutant("mirror = uniform() < 0.52", make_cifar_pipeline(mirror_kind=("lt", 0.52)), "flips half of the samples",
           words="fn.random.uniform(range=[0, 1]) < 0.52, a probability of 0.52"),
    Mutant("mirror = uniform() < 0.53", make_cifar_pipeline(mirror_kind=("lt", 0.53)), "flips half of the samples",
           words="a probability of 0.53"),
    Mutant("mirror = 0.48 > uniform()", make_cifar_pipeline(mirror_kind=("gt", 0.48)), "flips half of the samples",
           words="a probability of 0.48"),
    Mutant("offsets by fn.random.choice with p(0)=0.10", make_cifar_pipeline(positions="choice_skewed"),
           "crop offsets are uniform over 0..8", words="p=[0.1, 0.1125"),
    Mutant("device_id=None on the GPU", make_cifar_pipeline(device_id="none"), "runs on this process's GPU",
           words="torch.cuda.set_device"),
    Mutant("mean and std swapped", make_cifar_pipeline(mean=CIFAR_STD255, std=CIFAR_MEAN255),
           "each sample is an exact crop of its padded record, normalised", words="swapped"),
    # w3-04: four mistakes that got the generic rule, each now named
    Mutant("the std alone not times 255", make_cifar_pipeline(std=list(data.CIFAR10_STD)),
           "each sample is an exact crop of its padded record, normalised", words="the std is not"),
    Mutant("mean and std in BGR order", make_cifar_pipeline(mean=CIFAR_MEAN255[::-1], std=CIFAR_STD255[::-1]),
           "each sample is an exact crop of its padded record, normalised", words="BGR order"),
    Mutant("grey padding", make_cifar_pipeline(fill=128), "each sample is an exact crop of its padded record, normalised",
           words="grey"),
    Mutant("fn.pad to 40x40: padding at the end only", make_cifar_pipeline(pad="end"),
           "each sample is an exact crop of its padded record, normalised", words="at the end only"),
    # w5-04
    Mutant("external_source without batch_info=True", make_cifar_pipeline(batch_info=False),
           "the source is called with a BatchInfo", words="batch_info=True"),
    Mutant("crop_pos_x=0.5 fixed, y random", make_cifar_pipeline(positions="centre_x"), "crop offsets cover 0..8",
           words="the same horizontal offset, 4 (the centre, crop_pos_x=0.5); the vertical one varies"),
    # w6-04: three that passed, one message that named the draw for a one-sided pad
    Mutant("crop positions drawn with fixed operator seeds", make_cifar_pipeline(crop_op_seed=1234),
           "another seed changes the crops and the flips", words="the same crop window (only the flips changed)"),
    Mutant("the flip drawn with a fixed operator seed", make_cifar_pipeline(flip_op_seed=99),
           "another seed changes the crops and the flips", words="the same flip (only the crops changed)"),
    Mutant("seed if seed else None", make_cifar_pipeline(zero_seed_random=True), "reproducible under a seed",
           words="seed=0 is a seed like any other"),
    Mutant("device_id=torch.cuda.current_device()", make_cifar_pipeline(device_id="current"),
           "runs on this process's GPU", words="whether written as a fixed 0 or read from torch.cuda.current_device()"),
    Mutant("fn.pad to 36x36: 4 pixels at the bottom and right only", make_cifar_pipeline(pad="end36"),
           "crop offsets cover 0..8", words="as if it were padded at the bottom and on the right only"),
]



def test_4_1_padding_mistakes_lead_with_the_padding():
    """w5-04 w09/w10: grey padding and fn.pad's padding at the end were headed "not normalised as
    asked" while the hint named the padding: the headline names the padding now."""
    for answer in (make_cifar_pipeline(fill=128), make_cifar_pipeline(pad="end")):
        said = run_check("4.1", answer).message
        assert "not of the record padded with 4 black pixels on every side (normalised as asked)" in said, said
        assert "not normalised as asked" not in said, said


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU answers local_cuda_index() here")
def test_4_1_device_id_of_a_gpu_on_a_cpu_pipeline_says_none():
    """w5-04 w34: device_id=local_cuda_index() for device='cpu' too gave torch's raw "Found no
    NVIDIA driver" on a machine without a GPU; the check says a CPU pipeline wants device_id=None."""
    rejected("4.1", Mutant("device_id=local_cuda_index() on the CPU too", make_cifar_pipeline(device_id="always"),
                           "a CPU pipeline needs no GPU", words="pass device_id=None"), [3])


def test_4_1_correct_pipeline_passes():
    passes("4.1", make_cifar_pipeline(), range(2))


def test_4_1_right_answers_of_the_second_walk_pass():
    """w2-04: the flip from uniform(values=[0, 1]) (w41_16), seed + 1 (w41_25), fn.flip(horizontal=coin)
    after the normalisation (w41_29). (device_id=None, w41_22, fails since w3-04: the contract asks for
    GPU 3 by name.)"""
    for answer in (make_cifar_pipeline(mirror_kind="uniform01"),
                   make_cifar_pipeline(seed_offset=1), make_cifar_pipeline(flip_after=True)):
        passes("4.1", answer, [5])


def test_4_1_right_answers_of_the_third_walk_pass():
    """w3-04: the flip as uniform() < 0.5 or 0.5 > uniform(), the offsets from fn.random.choice without
    weights: read from the graph as fair, and the pass message says so."""
    for answer in (make_cifar_pipeline(mirror_kind=("lt", 0.5)), make_cifar_pipeline(mirror_kind=("gt", 0.5)),
                   make_cifar_pipeline(positions="choice")):
        passes("4.1", answer, [5])
    os.environ["COURSE_CHECK_SEED"] = "5"
    try:
        assert "a coin of probability 1/2, read from the pipeline's graph" in run_check("4.1", make_cifar_pipeline()).message
        said = run_check("4.1", make_cifar_pipeline(mirror_kind="uniform01")).message
        assert "probability was not read" in said and "a coin of probability 1/2" not in said
    finally:
        os.environ["COURSE_CHECK_SEED"] = "2404"


def test_dali_error_shows_its_sentence_first():
    """w2-04 (w41_28, w42_09): an [ERROR] was DALI's whole C++ page, the useful line in its middle."""
    from course_utils.checks._core import _exception_text
    text = ("Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.external_source`,\nwhich was used in "
            "the pipeline definition with the following traceback:\n\n  File \"/x/a.py\", line 14, in graph\n"
            "    images = fn.external_source(\n\nencountered:\n\nAssert on \"dtype_ == batch.type()\" failed: "
            "ExternalSource expected data of type int64 and got: int32\nC++ context: [/opt/dali/x.h:140] \n"
            "Current pipeline object is no longer valid.")
    got = _exception_text(RuntimeError(text))
    assert got.startswith("DALI stopped the pipeline: CPU operator `nvidia.dali.fn.external_source` (defined at line "
                          "14 of /x/a.py) said \"ExternalSource expected data of type int64 and got: int32\"")
    assert "C++ context" not in got and "Assert on" not in got
    assert _exception_text(ValueError("plain")) == "plain"


def test_4_1_other_right_answers_pass():
    """Right answers written another way (w1-04, x-04): padding and cropping with fn.slice at integer
    offsets, a pipeline built before it is returned, LOCAL_RANK read from the environment, separated
    prefetch queues."""
    import os

    def env_rank(source, batch_size, device="cpu", num_threads=2, seed=0):
        return make_cifar_pipeline(device_id=int(os.environ.get("LOCAL_RANK", 0)))(source, batch_size, device,
                                                                                   num_threads, seed)
    for answer in (padded_by_slices, make_cifar_pipeline(prebuilt=True), env_rank,
                   make_cifar_pipeline(pipe_kw=dict(prefetch_queue_depth={"cpu_size": 2, "gpu_size": 2}))):
        passes("4.1", answer, [5])


def seed_from_time(source, batch_size, device="cpu", num_threads=2, seed=0):
    """w8-04 w41_30: `seed=seed + int(time.time()) % 1000`: alike within one second, not tomorrow."""
    import time
    return make_cifar_pipeline()(source, batch_size, device, num_threads, seed + int(time.time()) % 1000)


def seed_from_hash(source, batch_size, device="cpu", num_threads=2, seed=0):
    """w8-04 w41_31: `seed=hash(("cifar", seed)) % 2**31`: Python salts str hashes per process."""
    return make_cifar_pipeline()(source, batch_size, device, num_threads, hash(("cifar", seed)) % 2**31)


def test_4_1_seed_from_the_clock_or_a_salted_hash_rejected():
    """w8-04: both passed on 8 of 8 seeds (the same-seed pair came from one process within one second).
    The fate does not depend on the draw (any seed, any clock), so one seed each."""
    for name, answer, words in (("seed from time.time()", seed_from_time, "time.time()"),
                                ("seed from hash() of a str", seed_from_hash, "salts it per process")):
        rejected("4.1", Mutant(name, answer, "reproducible under a seed", words=words), [3])
    said = run_check("4.1", seed_from_time).message
    assert "as if in another process 37 days later" in said


def test_another_process_later_moves_only_what_a_process_owns():
    import time
    real = hash(("cifar", 5)), hash(5), hash((1, 2.5)), os.getpid(), time.time()
    with lesson04._another_process_later():
        assert hash(("cifar", 5)) != real[0]
        assert hash(5) == real[1] and hash((1, 2.5)) == real[2]
        assert os.getpid() != real[3] and time.time() - real[4] > 37 * 86400
    assert hash(("cifar", 5)) == real[0] and os.getpid() == real[3] and time.time() - real[4] < 60


@pytest.mark.parametrize("mutant", MUTANTS_41_WALK, ids=repr)
def test_4_1_walk_mutants_rejected(mutant):
    _kept.clear()
    rejected("4.1", mutant, [3, 4] if mutant.name in ("a pipeline kept between calls", "mirror = uniform() < 0.52",
                                                      "two threads, whatever it is given") else [3])



# What each mutant does wrong shows in every batch of every run (a constant, a layout, a
# distribution over 1,100 samples), and a run builds DALI pipelines (a second): two seeds each.
@pytest.mark.parametrize("mutant", MUTANTS_41, ids=repr)
def test_4_1_mutants_rejected(mutant):
    rejected("4.1", mutant, range(2))


def test_4_1_stub_and_wrong_types():
    def stub(source, batch_size, device="cpu", num_threads=2, seed=0):
        raise NotImplementedError("Exercise 4.1")
    assert run_check("4.1", stub).status == "not_implemented"
    result = run_check("4.1", lambda source, batch_size, **kw: None)
    assert result.status == "fail" and "Pipeline" in result.message
    assert run_check("4.1", "cifar_pipeline").status == "fail"


# -- 4.2 ----------------------------------------------------------------------------------------

def make_cifar_epochs(*, ceil_bounds=False, take_rows=False,
                      per_sample=False, stateful=False, reshuffle=True, shard=True, shard_seed=False,
                      honour_drop_last=True, iterator=True, honour_shuffle=True, array_split=False, own_seed=False,
                      fixed_block=False, strided_shards=False, strided_view=False, label_dtype=np.int64,
                      shard_of_first_epoch=False, drop_last_per_shard=False, extra_batch_when_divides=False,
                      same_augmentation=False, positions_as_indices=False, device_ignored=False,
                      always_drop_last=False, cache_orders=False, auto_reset=True, int_slices=False,
                      whole_copy=False, copy_once=False, smallest_count=False, aug_shard_only=False,
                      epoch_positions=False, largest_drop_last=False, pad_last=False, undeclared_int32=False,
                      strided_uint8_labels=False, average_count=False, row_loop=False, sort_batch=False,
                      int32_indices=False, aug_times_shard=False, epoch_copy=False, one_more=False,
                      threads=None, hwc=False, two_reads=False):
    """A cifar_epochs builder with one knob per typical mistake (the defaults are right)."""
    cached = {}
    def cifar_epochs(records, batch_size, *, shuffle=True, seed=0, shard_id=0, num_shards=1, drop_last=False,
                     device="cpu", num_threads=2):
        n = len(records)
        if not shard:
            shard_id, num_shards = 0, 1
        if not honour_shuffle:
            shuffle = True
        if always_drop_last:
            drop_last = True
        if device_ignored:
            device = "cpu"
        start, stop = shard_id * n // num_shards, (shard_id + 1) * n // num_shards
        if int_slices:                # int(k * N / S): the same numbers, written another way
            start, stop = int(shard_id * n / num_shards), int((shard_id + 1) * n / num_shards)
        if array_split:               # numpy's split: the first shards get the extra records
            bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(n), num_shards)])
            start, stop = int(bounds[shard_id]), int(bounds[shard_id + 1])
        if strided_shards:
            start, stop = 0, len(range(shard_id, n, num_shards))
        if ceil_bounds:               # w7-04 42_ceil_boundaries: ceil(k*N/S) for both bounds
            start, stop = -(-shard_id * n // num_shards), -(-(shard_id + 1) * n // num_shards)
        full, rest = divmod(stop - start, batch_size)
        batches = full + (1 if rest and not (drop_last and honour_drop_last) else 0)
        if drop_last and honour_drop_last and not drop_last_per_shard:
            batches = (n // num_shards) // batch_size     # every shard the same number of full batches
        if one_more:                                     # w7-04 42_gt_not_ge: `if i > nb`, one call too many
            batches += 1
        if extra_batch_when_divides and not drop_last:
            batches = full + 1                           # one batch too many when the batch divides the shard
        if smallest_count and not drop_last:             # w2-04 w42_20: the smallest shard's count for every shard
            batches = -(-(n // num_shards) // batch_size)
        if average_count and not drop_last:              # w5-04 w27: ceil(N / (S*B)), the average shard's count
            batches = -(-n // num_shards // batch_size)
        if largest_drop_last and drop_last:              # w2-04 w42_13: the largest shard's count, ceil(N/S)//B
            batches = -(-n // num_shards) // batch_size

        def order(epoch):
            if cache_orders:          # kept at module level, by epoch only: the first call's order for ever
                key = epoch if cache_orders is True else (seed, epoch, shuffle)   # w3-04: keyed, but not on N
                if key not in cached:
                    cached[key] = np.random.default_rng((seed, epoch)).permutation(n) if shuffle else np.arange(n)
                return cached[key][start:stop]
            base = 12345 if own_seed else seed + (shard_id if shard_seed else 0)
            rng = np.random.default_rng((base, epoch if reshuffle else 0))
            if fixed_block:          # each shard a fixed block of arange(N), shuffled inside itself
                block = np.arange(start, stop)
                return rng.permutation(block) if shuffle else block
            if strided_shards:       # DistributedSampler's interleaving instead of the spec's slices
                return (rng.permutation(n) if shuffle else np.arange(n))[shard_id::num_shards]
            if shard_of_first_epoch:     # the shard's records drawn once, reshuffled inside each epoch
                mine = np.random.default_rng((seed, 0)).permutation(n)[start:stop]
                return np.random.default_rng((seed, epoch, 1)).permutation(mine) if epoch else mine
            return (rng.permutation(n) if shuffle else np.arange(n))[start:stop]

        # the whole file read into memory once per call (w9-04 w42_27); "asarray": np.asarray(records), a
        # view of the memory map, no copy (right); "lazy": copied at the source's first call, kept after
        held = np.array(records) if copy_once is True else np.asarray(records) if copy_once == "asarray" else records
        lazy = []

        def rows_of(idx):
            if copy_once == "lazy":
                if not lazy:
                    lazy.append(np.array(records))
                return rows_from(lazy[0], idx)
            return rows_from(held, idx)

        def rows_from(held, idx):
            # the whole file copied into memory on every batch (w1-04 4.2 #27), then indexed
            rows = np.array(records)[idx] if whole_copy else held[idx]
            if take_rows:                      # np.take of the batch's own rows: one call, right (the near
                rows = np.take(held, idx, axis=0)      # miss of the per-epoch np.take, w7-04)
            if row_loop:                       # w6-04 w42_23: right rows, one Python call each
                rows = np.stack([records[j] for j in idx])
            images = rows[:, 1:].reshape(-1, 3, 32, 32) if strided_view else \
                np.ascontiguousarray(rows[:, 1:]).reshape(-1, 3, 32, 32)
            if hwc:                            # w8-04 w42_25: the CHW bytes read as HWC, then transposed
                images = np.ascontiguousarray(rows[:, 1:]).reshape(-1, 32, 32, 3).transpose(0, 3, 1, 2).copy()
            if positions_as_indices:           # the positions within the batch, not the records' indices
                idx = np.arange(len(idx))
            if undeclared_int32:               # int32 labels to a source declared INT64 (w2-04 w42_09)
                return images, rows[:, 0].astype(np.int32), idx
            if int32_indices:                  # w6-04 w42_24: int32 indices to the course's pipeline
                return images, rows[:, 0].astype(np.int64), idx.astype(np.int32)
            if strided_uint8_labels:           # w3-04: rows[:, 0] left uint8, a strided view
                return images, rows[:, 0], idx
            if two_reads:                      # w10-04 w42_31: the images and the labels gathered apart
                return (records[idx, 1:].reshape(-1, 3, 32, 32), records[idx, 0].astype(np.int64),
                        idx.astype(np.int64))
            return images, rows[:, 0].astype(label_dtype), idx

        if per_sample:
            def source(info):
                if info.idx_in_epoch >= stop - start:
                    raise StopIteration
                images, labels, idx = rows_of(order(info.epoch_idx)[[info.idx_in_epoch]])
                return images[0], labels[0], idx[0].astype(np.int64)

            @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None, seed=seed)
            def graph():
                images, labels, indices = fn.external_source(
                    source=source, num_outputs=3, batch=False, layout=["CHW", "", ""],
                    dtype=[types.UINT8, types.INT64, types.INT64])
                padded = fn.crop(images, crop=(40, 40), out_of_bounds_policy="pad", fill_values=0)
                out = fn.crop_mirror_normalize(padded, crop=(32, 32), crop_pos_y=fn.random.uniform(values=NINE),
                                               crop_pos_x=fn.random.uniform(values=NINE),
                                               mirror=fn.random.coin_flip(), mean=CIFAR_MEAN255, std=CIFAR_STD255,
                                               dtype=types.FLOAT, output_layout="CHW")
                return out, labels, indices
            pipe = graph()
        else:
            calls = [0]

            epochs = [0]
            cache = {}

            def source(info):
                iteration = calls[0] if stateful else info.iteration   # a counter that never restarts
                epoch = epochs[0] if stateful == "resets both" else info.epoch_idx
                calls[0] += 1
                if iteration >= batches:
                    if stateful in ("resets", "resets both"):   # w2-04 w42_03: restarts at each epoch's end
                        calls[0] = 0                            # (w5-04 w10: the epoch counted too)
                        epochs[0] += 1
                    raise StopIteration
                idx = order(epoch)[iteration * batch_size:(iteration + 1) * batch_size]
                if pad_last and len(idx) < batch_size:       # w2-04 w42_19: the short batch filled up with repeats
                    idx = np.concatenate([idx, order(epoch)[:batch_size - len(idx)]])
                if sort_batch:                     # w6-04 w42_21: "sequential reads"
                    idx = np.sort(idx)
                if epoch_copy:                     # w7-04 42_epoch_materialized: the shard copied per epoch
                    if epoch not in cache:
                        cache.clear()
                        mine = order(epoch)
                        shard = (np.take(records, mine, axis=0) if epoch_copy == "take" else   # w7-04: another
                                 records[mine])                                   # route past the read count
                        cache[epoch] = (mine, shard)
                    mine, shard_rows = cache[epoch]
                    rows = shard_rows[iteration * batch_size:(iteration + 1) * batch_size]
                    images = np.ascontiguousarray(rows[:, 1:]).reshape(-1, 3, 32, 32)
                    return images, rows[:, 0].astype(np.int64), idx.astype(np.int64)
                images, labels, got = rows_of(idx.astype(np.int64))
                if epoch_positions:                # w2-04 w42_10: positions in the epoch as the indices
                    got = np.arange(iteration * batch_size, iteration * batch_size + len(idx), dtype=np.int64)
                return images, labels, got
            if label_dtype != np.int64:      # declared as what it returns: the labels come out as they are
                pipe = _declare_labels(source, batch_size, device, num_threads, seed + shard_id, label_dtype)
                it = DALIGenericIterator(pipe, ["images", "labels", "indices"], auto_reset=True)
                return it
            pipe = dali_pipelines.cifar_train_pipeline(source, batch_size=batch_size, device=device,
                                                       num_threads=max(num_threads, 2) if threads == "floor2"
                                                       else threads or num_threads,
                                                       seed=shard_id if aug_shard_only else
                                                       seed * (shard_id + 1) if aug_times_shard else
                                                       seed if same_augmentation else seed + shard_id)
        it = DALIGenericIterator(pipe, ["images", "labels", "indices"], auto_reset=auto_reset)
        if not iterator:
            return ([b] for b in it)
        return it
    return cifar_epochs


def _declare_labels(source, batch_size, device, num_threads, seed, label_dtype):
    """The CIFAR pipeline with the labels declared (and so returned) as `label_dtype`."""
    dali_type = {np.int32: types.INT32, np.uint8: types.UINT8}[label_dtype]

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed)
    def graph():
        images, labels, indices = fn.external_source(source=source, num_outputs=3, batch=True, batch_info=True,
                                                     layout=["CHW", "", ""],
                                                     dtype=[types.UINT8, dali_type, types.INT64])
        padded = fn.crop(images, crop=(40, 40), out_of_bounds_policy="pad", fill_values=0)
        out = fn.crop_mirror_normalize(padded, crop=(32, 32), crop_pos_y=fn.random.uniform(values=NINE),
                                       crop_pos_x=fn.random.uniform(values=NINE), mirror=fn.random.coin_flip(),
                                       mean=CIFAR_MEAN255, std=CIFAR_STD255, dtype=types.FLOAT, output_layout="CHW")
        return out, labels, indices
    return graph()


def the_course_epochs(records, batch_size, *, shuffle=True, seed=0, shard_id=0, num_shards=1, drop_last=False,
                      device="cpu", num_threads=2):
    source = dali_pipelines.CifarRecordBatches(records, batch_size, shuffle=shuffle, seed=seed, shard_id=shard_id,
                                               num_shards=num_shards, drop_last=drop_last)
    pipe = dali_pipelines.cifar_train_pipeline(source, batch_size=batch_size, device=device, num_threads=num_threads,
                                               seed=seed)
    return DALIGenericIterator(pipe, ["images", "labels", "indices"], auto_reset=True)


MUTANTS_42 = [
    Mutant("a per-sample source", make_cifar_epochs(per_sample=True), "each record once per epoch",
           words="per-sample source"),
    Mutant("a counter of its own", make_cifar_epochs(stateful=True), "yields every epoch", words="epoch_idx"),
    Mutant("the same order every epoch", make_cifar_epochs(reshuffle=False), "shuffles every epoch",
           words="epoch_idx"),
    Mutant("a seed of its own", make_cifar_epochs(own_seed=True), "visits the epoch's order"),
    Mutant("shuffle ignored", make_cifar_epochs(honour_shuffle=False), "shuffle=False keeps the records' order"),
    Mutant("shards ignored", make_cifar_epochs(shard=False), "shards split the records evenly"),
    Mutant("numpy's array_split", make_cifar_epochs(array_split=True), "shards split the records evenly",
           words="np.array_split"),
    Mutant("a seed per shard", make_cifar_epochs(shard_seed=True), "shards are disjoint and cover every record",
           words="same seed"),
    Mutant("drop_last ignored", make_cifar_epochs(honour_drop_last=False), "batch sizes follow the last-batch policy",
           words="drop_last"),
    Mutant("the course's record source", the_course_epochs, "is your own code", words="CifarRecordBatches.__init__"),
    # issue 28 / 21: wrong answers that passed
    Mutant("a fixed block per shard, shuffled inside", make_cifar_epochs(fixed_block=True),
           "a shard is its slice of the epoch's order", words="fixed block"),
    Mutant("a shard's records fixed after epoch 1", make_cifar_epochs(shard_of_first_epoch=True),
           "visits the epoch's order"),
    # and more of the same family
    Mutant("interleaved shards (DistributedSampler's)", make_cifar_epochs(strided_shards=True),
           "shards split the records evenly"),
    Mutant("a strided view returned", make_cifar_epochs(strided_view=True), "the source returns C-contiguous arrays",
           words="ascontiguousarray"),
    Mutant("int32 labels", make_cifar_epochs(label_dtype=np.int32), "labels and indices are int64", words="int64"),
]


MUTANTS_42_WALK = [
    Mutant("`if info.iteration > nb` (w7-04 42_gt_not_ge)", make_cifar_epochs(one_more=True),
           "ends the epoch after its last record", words="not >"),
    Mutant("pipeline seed seed * (shard_id + 1) (w7-04: 0 on every shard at seed=0)",
           make_cifar_epochs(aug_times_shard=True), "each shard draws its own augmentation",
           words="both given seed=0 (the default)"),
    Mutant("the shard copied once per epoch (w7-04 42_epoch_materialized)", make_cifar_epochs(epoch_copy=True),
           "reads only the batch's records", words="once an epoch"),
    Mutant("ceil(k*N/S) for the bounds (w7-04 42_ceil_boundaries: the hint named other rules)",
           make_cifar_epochs(ceil_bounds=True), "shards split the records evenly", words="ceil(k*N/S) for the bounds"),
    Mutant("the shard copied once per epoch by np.take (w7-04)", make_cifar_epochs(epoch_copy="take"),
           "reads only the batch's records", words="once an epoch"),
    Mutant("drop_last per shard (a longer shard, a batch more)", make_cifar_epochs(drop_last_per_shard=True),
           "with drop_last, every shard the same number of full batches", words="all-reduce"),
    Mutant("a batch too many when the batch divides the shard", make_cifar_epochs(extra_batch_when_divides=True),
           "ends the epoch after its last record", words="multiple of the batch"),
    Mutant("the same augmentation on every shard", make_cifar_epochs(same_augmentation=True),
           "each shard draws its own augmentation", words="seed + shard_id"),
    Mutant("positions as indices", make_cifar_epochs(positions_as_indices=True), "the indices are the records' indices",
           words="positions within the batch"),
    Mutant("always drops the last batch", make_cifar_epochs(always_drop_last=True), "each record once per epoch",
           words="exactly the last, shorter batch"),
    Mutant("device ignored", make_cifar_epochs(device_ignored=True), "device='gpu' augments on this process's GPU",
           words="never reach the GPU"),
    Mutant("the whole record file copied on every batch", make_cifar_epochs(whole_copy=True),
           "reads only the batch's records", words="records[idx]"),
    Mutant("orders cached between calls, by epoch only", make_cifar_epochs(cache_orders=True),
           "the order depends on the call's own records", words="kept between calls"),
    Mutant("orders cached by (seed, epoch, shuffle), not N", make_cifar_epochs(cache_orders="keyed"),
           "the order depends on the call's own records", words="not keyed on the dataset's size"),
    Mutant("labels left uint8, a strided view", make_cifar_epochs(strided_uint8_labels=True),
           "the source returns C-contiguous arrays", words="rows[:, 0].astype(np.int64)"),
    # w2-04: two wrong answers that passed on every seed, four messages that pointed elsewhere, DALI's page
    Mutant("every shard the smallest shard's batch count", make_cifar_epochs(smallest_count=True),
           "each record once per epoch", words="the count of the shorter shard"),
    Mutant("the augmentation's seed from shard_id alone", make_cifar_epochs(aug_shard_only=True),
           "each shard's augmentation follows the seed", words="ignores `seed`"),
    Mutant("positions in the epoch as indices", make_cifar_epochs(epoch_positions=True),
           "the indices are the records' indices", words="positions in the epoch"),
    Mutant("drop_last: the largest shard's count", make_cifar_epochs(largest_drop_last=True),
           "with drop_last, every shard the same number of full batches", words="its last batch is not full"),
    Mutant("shuffle ignored (w2-04: not 'kept between calls')", make_cifar_epochs(honour_shuffle=False),
           "shuffle=False keeps the records' order", words="shuffled anyway"),
    Mutant("the last batch filled up with repeats", make_cifar_epochs(pad_last=True),
           "each record at most once per epoch", words="filled up with records already seen"),
    Mutant("int32 labels from a source declared INT64", make_cifar_epochs(undeclared_int32=True),
           "labels and indices are int64", words="your source returned int32 where the pipeline's external_source "
           "declares int64"),
    # w6-04: a row loop passed; a sorted batch and int32 indices got messages about something else
    Mutant("rows read in a Python loop", make_cifar_epochs(row_loop=True), "reads each batch's rows in one call",
           words="one Python call per row"),
    Mutant("each batch's indices sorted", make_cifar_epochs(sort_batch=True), "visits the epoch's order",
           words="sorted within the batch"),
    Mutant("int32 indices", make_cifar_epochs(int32_indices=True), "labels and indices are int64",
           words="your source returned int32"),
    # w5-04 w27: the shorter of two shards, whose size the batch divides, asked for an empty batch
    Mutant("ceil(N / (S*B)) batches on every shard", make_cifar_epochs(average_count=True),
           "ends the epoch after its last record", words="ceil(N / (num_shards * batch_size))"),
]


def test_4_2_correct_loader_passes():
    passes("4.2", make_cifar_epochs(), range(2))


def test_4_2_other_right_answers_pass():
    """auto_reset=False (w1-04, w2-04, w5-04, w9-04 w42_16: right by the contract, which asks for
    exact epochs from a `for` loop per epoch: the pinned DALI 2.4's iterator resets an exhausted
    iterator when a new for loop begins; hint 1 says so), int(k*N/S) slices (w1-04), and np.take of
    a batch's own rows."""
    for answer in (make_cifar_epochs(auto_reset=False), make_cifar_epochs(int_slices=True),
                   make_cifar_epochs(take_rows=True)):
        passes("4.2", answer, [5])


def test_4_2_the_file_copied_once_per_call_is_rejected():
    """w9-04 w42_27: records = np.array(records) once at the top of cifar_epochs (the whole memory map
    copied into every process, 150 MB for CIFAR) passed on seeds 1-6; it was allowed since w1-04 as
    'costly in memory, not per batch', against the spec's 'a batch reads only its own rows'. What the
    call leaves allocated is measured, so the same verdict on every seed: one seed."""
    rejected("4.2", Mutant("the whole file copied once per call", make_cifar_epochs(copy_once=True),
                           "reads only the batch's records", words="records = np.array(records) once at the start"),
             [3])
    # near misses on both sides: the copy made at the source's first call and kept (wrong), and
    # np.asarray(records) at the top, a view of the memory map that copies nothing (right)
    rejected("4.2", Mutant("the whole file copied at the source's first call", make_cifar_epochs(copy_once="lazy"),
                           "reads only the batch's records", words="copied into"), [4, 5])
    passes("4.2", make_cifar_epochs(copy_once="asarray"), [4])


def test_4_2_a_counter_that_restarts_is_rejected():
    """w2-04 w42_03 and w5-04 w10: a counter of the source's own, set back to 0 where it raises
    StopIteration, passed (w2-04 accepted it). The lesson recommends parallel=True for a source like
    this exercise's, where each worker process holds its own copy of the counter (w5-04: 1,768
    samples in epoch 0, 1,000 distinct): the contract now says the source depends on its BatchInfo
    alone, and the check calls the source of a fresh iterator out of order."""
    for answer in (make_cifar_epochs(stateful="resets"), make_cifar_epochs(stateful="resets both")):
        rejected("4.2", Mutant("a counter that restarts", answer, "the source depends only on its BatchInfo",
                               words="called directly with BatchInfo(iteration=1, epoch_idx=1)"), [3, 4])


def test_4_2_third_walk_threads_and_layout():
    """w8-04: num_threads=2 whatever it is given passed on 8 seeds (w42_27); CHW bytes read as HWC and
    transposed were told to keep images and indices together (w42_25): the message names the layout."""
    rejected("4.2", Mutant("two threads, whatever it is given", make_cifar_epochs(threads=2),
                           "uses the threads it is given", words="num_threads=num_threads"), [3])
    rejected("4.2", Mutant("CHW records read as HWC", make_cifar_epochs(hwc=True), "images belong to their indices",
                           words="the pixel layout is wrong"), [3])


def jpeg_mixed_and_gpu_always(file_root, batch_size, *, crop=224, device="cpu", shard_id=0, num_shards=1,
                              num_threads=2, seed=0):
    """w8-04 w43_35: device_id=local_cuda_index() and the "mixed" decoder whatever the device."""
    return make_jpeg_pipeline(decoder_device="mixed", device_id=local_cuda_index())(
        file_root, batch_size, crop=crop, device=device, shard_id=shard_id, num_shards=num_shards,
        num_threads=num_threads, seed=seed)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU machine's message")
def test_4_3_mixed_decoder_and_device_id_on_the_cpu_both_named():
    rejected("4.3", Mutant("mixed decoder and device_id on the CPU", jpeg_mixed_and_gpu_always,
                           "a CPU pipeline needs no GPU", words="device='mixed' (and any .gpu()) only for device='gpu'"),
             [3])


def perm_cache_grows(records, batch_size, *, shuffle=True, seed=0, shard_id=0, num_shards=1, drop_last=False,
                     device="cpu", num_threads=2):
    """w8-04 w42_32: every epoch's permutation kept in a dict that is never cleared."""
    n = len(records)
    start, stop = shard_id * n // num_shards, (shard_id + 1) * n // num_shards
    batches = (n // num_shards) // batch_size if drop_last else -(-(stop - start) // batch_size)
    perms = {}

    def source(info):
        if info.iteration >= batches:
            raise StopIteration
        if info.epoch_idx not in perms:
            perms[info.epoch_idx] = (np.random.default_rng((seed, info.epoch_idx)).permutation(n) if shuffle
                                     else np.arange(n))
        idx = perms[info.epoch_idx][start:stop][info.iteration * batch_size:(info.iteration + 1) * batch_size]
        rows = records[idx]
        return np.ascontiguousarray(rows[:, 1:]).reshape(-1, 3, 32, 32), rows[:, 0].astype(np.int64), idx.astype(np.int64)
    pipe = dali_pipelines.cifar_train_pipeline(source, batch_size=batch_size, device=device, num_threads=num_threads,
                                               seed=seed + shard_id)
    return DALIGenericIterator(pipe, ["images", "labels", "indices"], auto_reset=True)


def test_4_2_every_epochs_order_kept_is_rejected():
    rejected("4.2", Mutant("every epoch's order kept", perm_cache_grows, "the source keeps nothing between calls",
                           words="keep the current epoch's only"), [3])


@pytest.mark.parametrize("mutant", MUTANTS_42_WALK, ids=repr)
def test_4_2_walk_mutants_rejected(mutant):
    rejected("4.2", mutant, [3, 4] if mutant.name in TWO_SEEDS_42 else [3])


# w2-04's false passes: their decisive inputs are in every seed's draw; two seeds show it
TWO_SEEDS_42 = {"every shard the smallest shard's batch count", "the augmentation's seed from shard_id alone",
                "ceil(N / (S*B)) batches on every shard"}


@pytest.mark.parametrize("mutant", MUTANTS_42, ids=repr)
def test_4_2_mutants_rejected(mutant):
    rejected("4.2", mutant, range(2))


def test_4_2_stub_and_wrong_type():
    def stub(records, batch_size, **kw):
        raise NotImplementedError("Exercise 4.2")
    assert run_check("4.2", stub).status == "not_implemented"
    result = run_check("4.2", make_cifar_epochs(iterator=False))
    assert result.status == "fail" and "DALIGenericIterator" in result.message


# -- 4.3 ----------------------------------------------------------------------------------------

def make_jpeg_pipeline(*, output_type="RGB", mean=NET_MEAN255, std=NET_STD255, shape_after_crop=False,
                       fixed_crop=None, reader_name="Reader", shard=True, reverse_labels=False, layout="CHW",
                       shuffle="after_epoch", mirror=True, pad_last_batch=True, crop_kind="random_resized",
                       stick_to_shard=False, flip_probability=0.5, device_id=None, shuffle_seed="seed",
                       aug_seed="per_shard", decoder_device=None, area=None, aspect=None, outputs="ILS",
                       split_by_hand=False, fill=None, threads=None, prefetch=None, mirror_lt=None, attempts=None,
                       mirror_shift=None):
    """A jpeg_pipeline builder with one knob per typical mistake (the defaults are right)."""
    def jpeg_pipeline(file_root, batch_size, *, crop=224, device="cpu", shard_id=0, num_shards=1, num_threads=2, seed=0):
        kw = dict(shard_id=shard_id, num_shards=num_shards) if shard else {}
        if reverse_labels:
            folder = __import__("course_utils.jpeg_folder", fromlist=["x"]).list_jpeg_folder(file_root)
            kw.update(files=[str(f) for f in folder.files],
                      labels=[len(folder.classes) - 1 - label for label in folder.labels])
        else:
            kw.update(file_root=file_root)
        kw.update({"after_epoch": dict(shuffle_after_epoch=True), "buffer": dict(random_shuffle=True),
                   "both": dict(shuffle_after_epoch=True, random_shuffle=True), "none": {}}[shuffle])
        if fill is not None:
            kw["initial_fill"] = fill
        if shuffle == "after_epoch" and shuffle_seed is not None:
            kw["shuffle_after_epoch_seed"] = {"seed": seed, "per_shard": seed + 1000 * shard_id,
                                              "plus_one": seed + 1}[shuffle_seed]
        if stick_to_shard:
            kw["stick_to_shard"] = True
        if split_by_hand:          # the file list split by the learner, the reader told nothing
            folder = __import__("course_utils.jpeg_folder", fromlist=["x"]).list_jpeg_folder(file_root)
            files, labels_ = [str(f) for f in folder.files], list(folder.labels)
            kw = dict(files=files[shard_id::num_shards], labels=labels_[shard_id::num_shards], shuffle_after_epoch=True)
        pipe_kw = dict(prefetch_queue_depth=prefetch) if prefetch else {}

        @pipeline_def(batch_size=batch_size, num_threads=max(num_threads, 2) if threads == "floor2" else
                      threads or num_threads,
                      device_id=None if device_id == "none" else this_gpu(device, device_id),
                      seed={"per_shard": seed + shard_id, "seed": seed, "fixed": 0, "shard": shard_id,
                            "times1000": seed * 1000 + shard_id,
                            "times_shard": seed * (shard_id + 1)}[aug_seed], **pipe_kw)
        def graph():
            jpegs, labels = fn.readers.file(pad_last_batch=pad_last_batch, name=reader_name, **kw)
            images = fn.decoders.image(jpegs, device="cpu" if decoder_device == "cpu, then .gpu()" else
                                       decoder_device or ("mixed" if device == "gpu" else "cpu"),
                                       output_type=getattr(types, output_type))
            shapes = images.shape()
            if device == "gpu" and decoder_device == "cpu, then .gpu()":   # decoded on the CPU, cropped on the GPU
                images = images.gpu()
            size = fixed_crop or crop
            if crop_kind == "resize":                # the whole image squeezed to size x size
                images = fn.resize(images, size=(size, size))
            elif crop_kind == "resize_random_position":   # w6-04 w43_29: no random area or aspect
                images = fn.resize(images, resize_shorter=int(size * 1.14))
                images = fn.crop(images, crop=(size, size), crop_pos_x=fn.random.uniform(range=[0.0, 1.0]),
                                 crop_pos_y=fn.random.uniform(range=[0.0, 1.0]))
            elif crop_kind == "centre":              # resized, then always the centre
                images = fn.resize(images, resize_shorter=size + size // 8)
                images = fn.crop(images, crop=(size, size))
            else:
                ranges = {}
                if area is not None:
                    ranges["random_area"] = list(area)
                if aspect is not None:
                    ranges["random_aspect_ratio"] = list(aspect)
                if attempts is not None:     # w10-04 w43_26: num_attempts=1
                    ranges["num_attempts"] = attempts
                images = fn.random_resized_crop(images, size=(size, size), **ranges)
            if shape_after_crop:
                shapes = images.shape()
            flip = fn.random.coin_flip(probability=flip_probability) if mirror else 0
            if mirror_lt is not None:        # w3-04: uniform() < c, not a coin_flip
                flip = fn.cast(fn.random.uniform(range=[0.0, 1.0]) < mirror_lt, dtype=types.INT32)
            if mirror_shift is not None:     # w11-04 y01: uniform() + c > 0.5, a coin of 0.5 + c
                flip = fn.cast(fn.random.uniform(range=[0, 1]) + mirror_shift > 0.5, dtype=types.INT32)
            images = fn.crop_mirror_normalize(images, mirror=flip, mean=mean, std=std, dtype=types.FLOAT,
                                              output_layout=layout)
            if device == "gpu" and decoder_device == "cpu":
                images = images.gpu()
            out = {"I": images, "S": shapes, "L": labels}
            return tuple(out[c] for c in outputs)
        return graph()
    return jpeg_pipeline


def the_course_jpeg_pipeline(file_root, batch_size, *, crop=224, device="cpu", shard_id=0, num_shards=1,
                             num_threads=2, seed=0):
    return dali_pipelines.jpeg_train_pipeline(file_root, batch_size=batch_size, crop=crop, device=device,
                                              shard_id=shard_id, num_shards=num_shards, num_threads=num_threads,
                                              seed=seed, with_shapes=True)


MUTANTS_43 = [
    Mutant("BGR", make_jpeg_pipeline(output_type="BGR"), "each image is its file's colour, normalised", words="BGR"),
    Mutant("not normalised", make_jpeg_pipeline(mean=[0.0] * 3, std=[1.0] * 3), "values are normalised",
           words="255*m"),
    Mutant("shape after the crop", make_jpeg_pipeline(shape_after_crop=True), "the third output is the decoded size",
           words="fn.decoders.image_random_crop) crops as it decodes, so its shape() is the crop's: take "
                 "fn.peek_image_shape(jpegs)"),     # w8-04 w43_36: the hint named only fn.decoders.image
    Mutant("a crop size of its own", make_jpeg_pipeline(fixed_crop=100), "images are (B, 3, crop, crop)"),
    Mutant("HWC", make_jpeg_pipeline(layout="HWC"), "images are (B, 3, crop, crop)", words="HWC"),
    Mutant("the reader not named", make_jpeg_pipeline(reader_name="files"), "the reader is named 'Reader'",
           words="name='Reader'"),
    Mutant("shards ignored", make_jpeg_pipeline(shard=False), "shard_id and num_shards split the files",
           words="shard_id"),
    Mutant("labels reversed", make_jpeg_pipeline(reverse_labels=True), "labels are the class folders' indices",
           words="sorted"),
    Mutant("files in folder order", make_jpeg_pipeline(shuffle="none"), "shuffles the files"),
    Mutant("never mirrored", make_jpeg_pipeline(mirror=False), "mirrors half of the images"),
    Mutant("the course's pipeline", the_course_jpeg_pipeline, "is your own code"),
    # issue 28: wrong answers that passed
    Mutant("no pad_last_batch", make_jpeg_pipeline(pad_last_batch=False), "every epoch is whole, not only the first",
           words="pad_last_batch"),
    Mutant("fn.resize to crop x crop", make_jpeg_pipeline(crop_kind="resize"), "crops a random window of each image",
           words="fn.resize"),
    Mutant("random_shuffle: a buffer of 1,024", make_jpeg_pipeline(shuffle="buffer"),
           "shuffles all the files every epoch", words="initial_fill"),
    Mutant("device_id=0 on every GPU", make_jpeg_pipeline(device_id=0), "runs on this process's GPU"),
    # and more of the same family
    Mutant("a centre crop", make_jpeg_pipeline(crop_kind="centre"), "crops a random window of each image",
           words="centre"),
    Mutant("random_shuffle, stick_to_shard", make_jpeg_pipeline(shuffle="buffer", stick_to_shard=True),
           "shuffles all the files every epoch", words="stick_to_shard=True, also given"),
    Mutant("mirrors 35%", make_jpeg_pipeline(flip_probability=0.35), "mirrors half of the images"),
]


# Mutants whose mistake shows in a draw of random numbers (an order, crops, flips) run on two
# seeds; the others fail on the first batch whatever the seed, and a run writes and reads
# thousands of files: one seed.
RANDOM_43 = {"no pad_last_batch", "fn.resize to crop x crop", "random_shuffle: a buffer of 1,024", "a centre crop",
             "random_shuffle, stick_to_shard", "mirrors 35%", "never mirrored", "files in folder order"}


def resize_shorter_then_random_crop(file_root, batch_size, *, crop=224, device="cpu", shard_id=0, num_shards=1,
                                    num_threads=2, seed=0):
    """w7-04 43_resize_then_random_crop: the shorter side resized to crop, then a crop at a random position."""
    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed + shard_id)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=file_root, shuffle_after_epoch=True, shuffle_after_epoch_seed=seed,
                                        shard_id=shard_id, num_shards=num_shards, pad_last_batch=True, name="Reader")
        images = fn.decoders.image(jpegs, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)
        shapes = images.shape()
        images = fn.resize(images, resize_shorter=crop)
        images = fn.crop(images, crop=(crop, crop), crop_pos_x=fn.random.uniform(range=[0, 1]),
                         crop_pos_y=fn.random.uniform(range=[0, 1]))
        images = fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(probability=0.5), mean=NET_MEAN255,
                                          std=NET_STD255, dtype=types.FLOAT, output_layout="CHW")
        return images, labels, shapes
    return pipe()


def fused_decode_and_crop(file_root, batch_size, *, crop=224, device="cpu", shard_id=0, num_shards=1, num_threads=2,
                          seed=0):
    """DALI's ImageNet pattern: the crop window decoded alone (fn.decoders.image_random_crop), then
    resized; the shape peeked from the file (x-04 R3: right)."""
    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed + shard_id)
    def graph():
        jpegs, labels = fn.readers.file(file_root=file_root, shuffle_after_epoch=True, shuffle_after_epoch_seed=seed,
                                        shard_id=shard_id, num_shards=num_shards, pad_last_batch=True, name="Reader")
        shapes = fn.peek_image_shape(jpegs)
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if device == "gpu" else "cpu",
                                               output_type=types.RGB)
        images = fn.resize(images, size=(crop, crop))
        images = fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(probability=0.5), mean=NET_MEAN255,
                                          std=NET_STD255, dtype=types.FLOAT, output_layout="CHW")
        return images, labels, shapes
    return graph()


# issue 37: a learner's walk (w1-04) and an expert's review (x-04). What is read from the graph (where the
# decoding runs, the crop's ranges, the coin) or from the reader (its shards) is the same on every seed;
# the rest (an order, flips) is decided by thousands of draws: one seed each, a few on two.
MUTANTS_43_WALK = [
    Mutant("random_shuffle beside shuffle_after_epoch (DALI's C++ assert, translated)", make_jpeg_pipeline(shuffle="both"),
           "shuffles all the files every epoch", words="cannot be given together"),
    Mutant("stick_to_shard=True beside shuffle_after_epoch (w7-04: DALI's C++ assert, translated)",
           make_jpeg_pipeline(stick_to_shard=True), "every shard reads new files each epoch",
           words="cannot be given together"),
    Mutant("the shorter side resized, then a crop at a random position (w7-04)", resize_shorter_then_random_crop,
           "crops a random window of each image"),     # its share of whole-width crops is near the bar: either message
    Mutant("pipeline seed seed * (shard_id + 1) (w7-04: 0 on every shard at seed=0)",
           make_jpeg_pipeline(aug_seed="times_shard"), "each shard draws its own augmentation",
           words="both given seed=0 (the default)"),
    Mutant("decodes on the CPU for device='gpu'", make_jpeg_pipeline(decoder_device="cpu"),
           "device='gpu' decodes on this process's GPU", words="device='mixed'"),
    Mutant("decodes on the CPU, crops on the GPU (x-04)", make_jpeg_pipeline(decoder_device="cpu, then .gpu()"),
           "device='gpu' decodes on this process's GPU", words="device='mixed'"),
    Mutant("device_id=None and the CPU decoder", make_jpeg_pipeline(decoder_device="cpu", device_id="none"),
           "device='gpu' decodes on this process's GPU", words="device='mixed'"),
    Mutant("random_area [0.5, 1]", make_jpeg_pipeline(area=(0.5, 1.0)), "crops a random window of each image",
           words="random_area=[0.5, 1]"),
    Mutant("random_area [0.08, 0.5]", make_jpeg_pipeline(area=(0.08, 0.5)), "crops a random window of each image",
           words="random_area"),
    Mutant("random_area [0.9, 1]", make_jpeg_pipeline(area=(0.9, 1.0)), "crops a random window of each image",
           words="random_area"),
    Mutant("aspect ratio 1", make_jpeg_pipeline(aspect=(1.0, 1.0)), "crops a random window of each image",
           words="random_aspect_ratio"),
    Mutant("aspect ratio 1/2 to 2", make_jpeg_pipeline(aspect=(0.5, 2.0)), "crops a random window of each image",
           words="random_aspect_ratio"),
    Mutant("mirrors 53%", make_jpeg_pipeline(flip_probability=0.53), "mirrors half of the images",
           words="probability=0.53"),
    Mutant("mirrors 47%", make_jpeg_pipeline(flip_probability=0.47), "mirrors half of the images",
           words="probability=0.47"),
    Mutant("mirrors 55%", make_jpeg_pipeline(flip_probability=0.55), "mirrors half of the images",
           words="probability=0.55"),
    Mutant("random_shuffle, a buffer bigger than the folder", make_jpeg_pipeline(shuffle="buffer", fill=8192),
           "every epoch is a new permutation of all files", words="random_shuffle"),
    Mutant("random_shuffle, a big buffer, stick_to_shard", make_jpeg_pipeline(shuffle="buffer", fill=8192,
                                                                              stick_to_shard=True),
           "every shard reads new files each epoch", words="stick_to_shard"),
    Mutant("a shuffle seed per shard", make_jpeg_pipeline(shuffle_seed="per_shard"), "shard_id and num_shards split the files",
           words="different permutations"),
    Mutant("no shuffle seed (DALI's fixed one)", make_jpeg_pipeline(shuffle_seed=None), "the order follows the seed",
           words="shuffle_after_epoch_seed"),
    Mutant("the same augmentation on every shard", make_jpeg_pipeline(aug_seed="seed"),
           "each shard draws its own augmentation", words="seed + shard_id"),
    Mutant("a fixed augmentation seed", make_jpeg_pipeline(aug_seed="fixed"), "each shard draws its own augmentation",
           words="seed + shard_id"),
    Mutant("outputs in another order", make_jpeg_pipeline(outputs="ISL"), "the outputs are images, labels, shapes",
           words="in that order"),
    Mutant("the files split by hand", make_jpeg_pipeline(split_by_hand=True), "shard_id and num_shards split the files",
           words="num_shards=1"),
    Mutant("CIFAR's constants", make_jpeg_pipeline(mean=CIFAR_MEAN255, std=CIFAR_STD255),
           "each image is its file's colour, normalised", words="CIFAR-10"),
    Mutant("one thread, whatever it is given", make_jpeg_pipeline(threads=1), "uses the threads it is given"),
    # w2-04: the signature's default whatever it is given (w41_14's mistake), an augmentation seed of shard_id alone
    Mutant("two threads, whatever it is given", make_jpeg_pipeline(threads=2), "uses the threads it is given",
           words="your pipeline runs 2"),
    Mutant("the augmentation's seed from shard_id alone", make_jpeg_pipeline(aug_seed="shard"),
           "each shard's augmentation follows the seed", words="ignores `seed`"),
    # w3-04: a flip that is no coin_flip, read from the graph; a range 1.25% off; device_id=None
    Mutant("mirror = uniform() < 0.53", make_jpeg_pipeline(mirror_lt=0.53), "mirrors half of the images",
           words="fn.random.uniform(range=[0, 1]) < 0.53"),
    Mutant("mirror = uniform() < 0.55", make_jpeg_pipeline(mirror_lt=0.55), "mirrors half of the images",
           words="a probability of 0.55"),
    Mutant("random_area [0.081, 1] (1.25% off)", make_jpeg_pipeline(area=(0.081, 1.0)),
           "crops a random window of each image", words="within 0.5%"),
    Mutant("device_id=None on the GPU", make_jpeg_pipeline(device_id="none"), "runs on this process's GPU",
           words="device_id=None"),
    # w6-04: a resize and a crop at a random position passed; random_area in percent crashed the process
    Mutant("resized, then cropped at a random position", make_jpeg_pipeline(crop_kind="resize_random_position"),
           "crops a random window of each image", words="no operator that draws a random area and aspect ratio"),
    Mutant("random_area in percent", make_jpeg_pipeline(area=(8, 100)), "crops a random window of each image",
           words="a fraction of the image's, 0 to 1, not a percent"),
    # w8-04 w43_30: [0.08, 1.005] was told "not a percent"
    Mutant("random_area just above 1", make_jpeg_pipeline(area=(0.08, 1.005)), "crops a random window of each image",
           words="1.005 is above 1"),
    # the near-miss rule, a second look (issue 37): ImageNet's std rounded to two decimals
    Mutant("ImageNet's std rounded", make_jpeg_pipeline(std=[255 * 0.23, 255 * 0.22, 255 * 0.23]),
           "values are normalised with ImageNet's mean and std", words="rounded ones"),
    Mutant("ImageNet's mean rounded", make_jpeg_pipeline(mean=[255 * 0.49, 255 * 0.46, 255 * 0.41]),
           "values are normalised with ImageNet's mean and std", words="rounded ones"),
]
RANDOM_43_WALK = {"a shuffle seed per shard", "the same augmentation on every shard",
                  "the augmentation's seed from shard_id alone"}


def test_4_3_correct_pipeline_passes():
    passes("4.3", make_jpeg_pipeline(), range(2))


def test_4_3_other_right_answers_pass():
    """DALI's fused decode-and-crop with the shape peeked from the file (x-04 R3), the constants of
    DALI's own ResNet-50 example (ImageNet's times 255, written to two decimals), and the shuffle's
    seed derived from seed (x-04 F4)."""
    passes("4.3", fused_decode_and_crop, [5])
    passes("4.3", make_jpeg_pipeline(mean=[123.68, 116.28, 103.53], std=[58.395, 57.12, 57.375]), [5])
    # x-04 F4: shuffle_after_epoch_seed derived from seed, the same in every process (it failed before)
    passes("4.3", make_jpeg_pipeline(shuffle_seed="plus_one"), [5])
    # w2-04: the mean 0.3% off (inside the contract's 0.5%, w43_18), seed * 1000 + shard_id (w43_20)
    passes("4.3", make_jpeg_pipeline(mean=[1.003 * m for m in NET_MEAN255]), [5])
    passes("4.3", make_jpeg_pipeline(aug_seed="times1000"), [5])
    # w3-04: 4/3 written 1.33 (0.25% off, within the stated 0.5%), the flip as uniform() < 0.5
    passes("4.3", make_jpeg_pipeline(aspect=(0.75, 1.33), mirror_lt=0.5), [5])


@pytest.mark.parametrize("mutant", MUTANTS_43_WALK, ids=repr)
def test_4_3_walk_mutants_rejected(mutant):
    rejected("4.3", mutant, [3, 4] if mutant.name in RANDOM_43_WALK else [3])


def test_4_3_colour_message_rounds_its_numbers():
    """w1-04: the BGR message printed [-1.0399999618530273, 0.07000000029802322]."""
    result = run_check("4.3", make_jpeg_pipeline(output_type="BGR"))
    assert result.status == "fail" and "BGR" in result.message
    assert not any(len(tok) > 8 for tok in result.message.replace("[", " ").replace("]", " ").replace(",", " ").split()
                   if tok.lstrip("-").replace(".", "").isdigit())


@pytest.mark.parametrize("mutant", MUTANTS_43, ids=repr)
def test_4_3_mutants_rejected(mutant):
    rejected("4.3", mutant, range(2) if mutant.name in RANDOM_43 else range(1))


def test_4_3_stub():
    def stub(file_root, batch_size, **kw):
        raise NotImplementedError("Exercise 4.3")
    assert run_check("4.3", stub).status == "not_implemented"


# -- without DALI --------------------------------------------------------------------------------

@pytest.mark.parametrize("exercise_id", ["4.1", "4.2", "4.3"])
def test_without_dali_each_check_says_so_in_one_sentence(monkeypatch, exercise_id):
    monkeypatch.setattr(lesson04, "has_dali", lambda: False)
    result = run_check(exercise_id, make_cifar_pipeline())
    assert result.status == "fail"
    assert result.message == lesson04.DALI_MISSING
    assert result.message.count(". ") == 0 and result.message.endswith(".")


# -- the statistical bars: a right answer never fails them ----------------------------------------

def test_4_1_bars_hold_for_fair_draws():
    """Check 4.1's uniformity, independence and flip bars on 400 simulated right answers: none
    fails, and the largest statistic seen stays well under its bar."""
    rng = np.random.default_rng(7)
    n = lesson04._STAT_BATCH * lesson04._STAT_BATCHES
    worst = {"uniform": 0.0, "independent": 0.0, "flip": 0.0}
    for _ in range(400):
        dy, dx = rng.integers(0, 9, n), rng.integers(0, 9, n)
        flipped = rng.random(n) < 0.5
        batches = [(dy[k::lesson04._STAT_BATCHES], dx[k::lesson04._STAT_BATCHES], flipped[k::lesson04._STAT_BATCHES])
                   for k in range(lesson04._STAT_BATCHES)]
        lesson04._check_randomness(batches, "simulated", 0)
        counts = np.bincount(dy, minlength=9)
        worst["uniform"] = max(worst["uniform"], float(((counts - n / 9) ** 2 / (n / 9)).sum()))
        worst["independent"] = max(worst["independent"], lesson04._chi2_independence(dy, dx, 9, 9))
        worst["flip"] = max(worst["flip"], abs(float(flipped.mean()) - 0.5))
    assert worst["uniform"] < 0.75 * lesson04._CHI2_UNIFORM_9
    assert worst["independent"] < 0.85 * lesson04._CHI2_INDEPENDENT_9x9
    assert worst["flip"] < 0.75 * lesson04._FLIP_TOLERANCE


def test_4_3_shuffle_bar_separates_a_permutation_from_a_buffer():
    """The resultant of two epochs' moves: a fresh permutation of 3,000 files stays far under the
    bar; a reshuffle inside a 1,024-file window of the same order (what random_shuffle does) far
    over it."""
    rng = np.random.default_rng(3)
    n = 3000
    keys = list(range(n))
    fresh = [lesson04._shift_resultant(list(rng.permutation(keys)), list(rng.permutation(keys))) for _ in range(200)]
    assert max(fresh) < 0.5 * lesson04._SHUFFLE_BAR

    def buffered(order, fill=1024):
        buffer, out = list(order[:fill]), []
        for item in order[fill:]:
            k = int(rng.integers(len(buffer)))
            out.append(buffer[k])
            buffer[k] = item
        rng.shuffle(buffer)
        return out + buffer

    base = list(rng.permutation(keys))
    local = [lesson04._shift_resultant(buffered(base), buffered(base)) for _ in range(20)]
    assert min(local) > 1.5 * lesson04._SHUFFLE_BAR


def test_4_3_range_mistakes_name_no_device():
    """w7-04: a crop-range mistake, read from the graph before any run, was reported "with device='gpu'" on a
    machine without one."""
    os.environ["COURSE_CHECK_SEED"] = "3"
    try:
        result = run_check("4.3", make_jpeg_pipeline(area=(0.1, 1.0)))
    finally:
        os.environ.pop("COURSE_CHECK_SEED", None)
    assert result.status == "fail" and "before any run" in result.message, result.message
    assert "device='gpu'" not in result.message.split("Hint")[0], result.message


def test_4_1_w7_prefetch_depth_1_named_alone():    # w7-04 41_prefetch_depth_1: the three settings listed, none named
    rejected("4.1", Mutant("prefetch_queue_depth=1 alone", make_cifar_pipeline(pipe_kw=dict(prefetch_queue_depth=1)),
                           "keeps DALI's prefetching", words="your pipeline sets prefetch_queue_depth=1 (a queue of 1"),
             [3])


def test_identical_pipelines_are_not_called_different():
    """w9-04 cell 55: a cifar_pipeline that builds exactly the course's graph was judged "slower in every
    turn ... by more than either pipeline's own spread". The lesson now reads both graphs first: the
    same graph is the same work, and no turn decides otherwise; a graph that differs (a coin of 0.47,
    another thread count) is still compared by its turns."""
    def source(info):
        raise StopIteration
    course = dali_pipelines.cifar_train_pipeline(source, batch_size=64, device="cpu", num_threads=2, seed=0)
    same = make_cifar_pipeline()(source, 64, device="cpu", num_threads=2, seed=0)
    assert dali_pipelines.same_graph(same, course) is True
    for other in (make_cifar_pipeline(flip_probability=0.47)(source, 64, device="cpu", num_threads=2, seed=0),
                  make_cifar_pipeline()(source, 64, device="cpu", num_threads=3, seed=0)):
        assert dali_pipelines.same_graph(other, course) is False


# -- w10-04's false passes -------------------------------------------------------------------------

def test_4_1_rounded_uniform_offsets_read_from_the_graph():
    """w10-04 w41_23: offsets cast (rounded) from uniform(range=[-0.4, 8.4]) give 0 and 8 at 10.2%
    each, not 11.1%, and passed on 5 of 8 seeds, on the measured rates alone. The graph now gives the
    chances of a rounded range, so any range but [-0.5, 8.5) fails before any statistics, on every
    seed (w41_22, [-0.49, 8.49], 0.8% short at the ends, with it: decided wrong, the contract says
    every offset equally likely); [-0.5, 8.5] itself passes. Its verdict comes from the graph: one
    seed for each."""
    rejected("4.1", Mutant("offsets rounded from [-0.4, 8.4]", make_cifar_pipeline(rounded_range=(-0.4, 8.4)),
                           "crop offsets are uniform over 0..8", words="0..8 with chances 10.23%, 11.36%"), [4])
    rejected("4.1", Mutant("offsets rounded from [-0.49, 8.49]", make_cifar_pipeline(rounded_range=(-0.49, 8.49)),
                           "crop offsets are uniform over 0..8", words="exactly [-0.5, 8.5)"), [1])
    passes("4.1", make_cifar_pipeline(rounded_range=(-0.5, 8.5)), [4])


def test_rounded_uniform_chances():
    """The chances the graph reading gives a rounded range: DALI rounds to the nearest integer."""
    pipe = make_cifar_pipeline(rounded_range=(-0.4, 8.4))(lesson04._no_batches, 8, num_threads=3, seed=1)
    weights = [w for kind, _, w in lesson04._random_draws(pipe) if kind == "choice"][0]
    assert np.allclose(weights, [0.9 / 8.8] + [1 / 8.8] * 7 + [0.9 / 8.8])
    pipe = make_cifar_pipeline(positions="int_range")(lesson04._no_batches, 8, num_threads=3, seed=1)
    weights = [w for kind, _, w in lesson04._random_draws(pipe) if kind == "choice"][0]
    assert np.allclose(weights, [1 / 16] + [1 / 8] * 7 + [1 / 16])
    for fair in (make_cifar_pipeline(rounded_range=(-0.5, 8.5)), make_cifar_pipeline(mirror_kind="uniform01")):
        assert not [d for d in lesson04._random_draws(fair(lesson04._no_batches, 8, num_threads=3, seed=1))
                    if d[0] == "choice"]


def test_4_1_thread_counts_and_the_seed():
    """w10-04 w41_31: max(num_threads, 2) passed (the check asked for 3 threads only); w41_16:
    seed + num_threads passed (the same-seed pairs had 3 threads each). 1 and more threads than the
    cores are asked for now, and 1 thread must augment as 3 do. Both fates are fixed: one seed."""
    rejected("4.1", Mutant("at least 2 threads", make_cifar_pipeline(threads="floor2"),
                           "uses the threads it is given", words="asked for num_threads=1, your pipeline runs 2"), [2])
    rejected("4.1", Mutant("seed + num_threads", make_cifar_pipeline(seed_plus_threads=True),
                           "reproducible under a seed", words="num_threads=1"), [2])


def test_4_2_thread_floor_and_two_reads():
    """The near-miss rule on 4.2: max(num_threads, 2) fails as in 4.1 and 4.3. w10-04 w42_31: the images
    and the labels gathered by two whole-batch reads of the memory map passes: the second re-reads
    rows whose pages the first brought in (no per-row Python, no copy of the file), what the contract's
    reading rule is for; the pass line no longer says 'in one call'."""
    rejected("4.2", Mutant("at least 2 threads", make_cifar_epochs(threads="floor2"),
                           "uses the threads it is given", words="num_threads=1): your pipeline runs 2"), [3])
    os.environ["COURSE_CHECK_SEED"] = "5"
    try:
        result = run_check("4.2", make_cifar_epochs(two_reads=True))
        assert result.status == "pass", result.message
        assert "in one call" not in result.message and "not row by row" in result.message
    finally:
        os.environ["COURSE_CHECK_SEED"] = "2404"


def test_4_3_thread_floor_and_attempts():
    """w10-04 w43_32: max(2, num_threads) passed; w43_26: num_attempts=1 (one crop in seven the whole
    image) passed. Both read before any run: one seed."""
    rejected("4.3", Mutant("at least 2 threads", make_jpeg_pipeline(threads="floor2"),
                           "uses the threads it is given", words="asked for num_threads=1, your pipeline runs 2"), [2])
    rejected("4.3", Mutant("num_attempts=1", make_jpeg_pipeline(attempts=1),
                           "crops a random window of each image", words="num_attempts=1"), [2])
    passes("4.3", make_jpeg_pipeline(attempts=20), [2])


def test_rounded_uniform_read_through_a_scale_and_a_shift():
    """The near miss of w41_23: the same rounded range written cast(uniform(range=[-0.05, 1.05]) * 8) is
    read through the arithmetic; uniform([0, 1]) * 9 - 0.5, rounded, is fair and reads so."""
    def draws(expr):
        @pipeline_def(batch_size=4, num_threads=1, device_id=None, seed=1)
        def graph():
            u = fn.random.uniform(range=[-0.05, 1.05] if expr == "short" else [0.0, 1.0])
            return fn.cast(u * 8 if expr == "short" else u * 9 - 0.5, dtype=types.INT32)
        return [d for d in lesson04._random_draws(graph()) if d[0] == "choice"]
    (_, how, weights), = draws("short")
    assert np.allclose(weights, [0.9 / 8.8] + [1 / 8.8] * 7 + [0.9 / 8.8]) and "range=[-0.05, 1.05]) * 8" in how
    assert draws("fair") == []


# -- w11-04 ------------------------------------------------------------------------------------------

def _flip_read(expr):
    """The flips the graph reading finds for `mirror=fn.cast(<expr>, INT32)`; graph only, nothing runs."""
    @pipeline_def(batch_size=4, num_threads=1, device_id=None, seed=1)
    def graph():
        u = fn.random.uniform(range=[0, 1])
        return fn.cast(expr(u), dtype=types.INT32)
    return [(how, p) for kind, how, p in lesson04._random_draws(graph()) if kind == "flip"]


def test_flip_read_through_arithmetic_before_the_comparison():
    """w11-04 y01: uniform(range=[0, 1]) + 0.01 > 0.5 (a coin of 0.51) was not read from the graph and
    passed on the measured band. Arithmetic with constants between the draw and the comparison is
    followed now, on either side, with every comparison."""
    cases = [
        (lambda u: u + 0.01 > 0.5, 0.51, "fn.random.uniform(range=[0, 1]) + 0.01 > 0.5"),
        (lambda u: 0.02 + u > 0.5, 0.52, "+ 0.02 > 0.5"),
        (lambda u: u - 0.01 > 0.5, 0.49, "- 0.01 > 0.5"),
        (lambda u: u * 0.98 < 0.5, 0.5 / 0.98, "* 0.98 < 0.5"),
        (lambda u: 2 * u >= 1.02, 0.49, "* 2 >= 1.02"),
        (lambda u: u / 2 <= 0.26, 0.52, "/ 2 <= 0.26"),
        (lambda u: 0.5 < u + 0.01, 0.51, "+ 0.01 > 0.5"),
        (lambda u: 0.5 >= u - 0.02, 0.52, "- 0.02 <= 0.5"),
        (lambda u: 1 - u < 0.49, 0.49, "1 - fn.random.uniform(range=[0, 1]) < 0.49"),
        (lambda u: (u * 2 - 0.5) / 1.0 > 0.5, 0.5, "((fn.random.uniform(range=[0, 1]) * 2) - 0.5) / 1 > 0.5"),
        (lambda u: u + 0.0 <= 0.5, 0.5, "+ 0 <= 0.5"),
    ]
    for expr, p, shown in cases:
        (how, got), = _flip_read(expr)
        assert abs(got - p) < 1e-9 and shown in how, (how, got, p)


W11_SHIFTED_COINS = [
    ("4.1", Mutant("mirror = uniform() + 0.01 > 0.5", make_cifar_pipeline(mirror_kind=("shift", 0.01)),
                   "flips half of the samples", words="fn.random.uniform(range=[0, 1]) + 0.01 > 0.5, a probability of 0.51")),
    ("4.1", Mutant("mirror = uniform() + 0.02 > 0.5", make_cifar_pipeline(mirror_kind=("shift", 0.02)),
                   "flips half of the samples", words="a probability of 0.52")),
    ("4.3", Mutant("mirror = uniform() + 0.01 > 0.5", make_jpeg_pipeline(mirror_shift=0.01),
                   "mirrors half of the images", words="fn.random.uniform(range=[0, 1]) + 0.01 > 0.5, a probability of 0.51")),
    ("4.3", Mutant("mirror = uniform() + 0.02 > 0.5", make_jpeg_pipeline(mirror_shift=0.02),
                   "mirrors half of the images", words="a probability of 0.52")),
]


@pytest.mark.parametrize("exercise_id, mutant", W11_SHIFTED_COINS, ids=repr)
def test_shifted_uniform_coins_rejected_from_the_graph(exercise_id, mutant):
    """w11-04 y01 (4.1 and 4.3): the probability is read from the graph, so the verdict does not depend
    on the draws: one seed each (the graph reading itself is tested on every form above)."""
    rejected(exercise_id, mutant, [3])


def test_integer_uniform_reads_as_dali_draws_it():
    """w11-04 x07: uniform(range=[-0.5, 8.5], dtype=INT32) was read as nine equal chances (the check
    then rejected it on the measured 12.3%, with a hint saying it rounds from a continuous draw). DALI
    2.4 cuts the ends to integers ([0, 8)) and rounds a continuous draw: 0 and 8 at 1/16 (measured
    here on 20,000 draws too); the graph says so and the hint names the integer dtype."""
    @pipeline_def(batch_size=4096, num_threads=1, device_id=None, seed=1)
    def graph():
        return (fn.random.uniform(range=[-0.5, 8.5], dtype=types.INT32),
                fn.random.uniform(range=[-1.5, 2.5], dtype=types.INT32))
    pipe = graph()
    (_, how, weights), = [d for d in lesson04._random_draws(pipe, 0) if d[0] == "choice"]
    assert np.allclose(weights, [1 / 16] + [1 / 8] * 7 + [1 / 16]) and "[0, 8)" in how, how
    (_, how, weights2), = [d for d in lesson04._random_draws(pipe, 1) if d[0] == "choice"]
    assert np.allclose(weights2, [1 / 6, 1 / 3, 1 / 3, 1 / 6]), weights2
    pipe.build()
    drawn = [np.array(t.as_tensor()).ravel() for t in pipe.run()]
    for values, w in zip(drawn, (weights, weights2)):
        share = np.bincount(values - values.min()) / len(values)
        assert np.allclose(share, w, atol=0.02), (share, w)

    def int_dtype_offsets(source, batch_size, device="cpu", num_threads=2, seed=0):
        @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=this_gpu(device), seed=seed)
        def cifar():
            images, labels, indices = fn.external_source(source=source, num_outputs=3, batch=True, batch_info=True,
                                                         layout=["CHW", "", ""],
                                                         dtype=[types.UINT8, types.INT64, types.INT64])
            if device == "gpu":
                images = images.gpu()
            padded = fn.crop(images, crop=(40, 40), out_of_bounds_policy="pad", fill_values=0)
            py, px = (fn.random.uniform(range=[-0.5, 8.5], dtype=types.INT32) / 8.0 for _ in range(2))
            out = fn.crop_mirror_normalize(padded, crop=(32, 32), crop_pos_y=py, crop_pos_x=px,
                                           mirror=fn.random.coin_flip(probability=0.5), mean=CIFAR_MEAN255,
                                           std=CIFAR_STD255, dtype=types.FLOAT, output_layout="CHW")
            return out, labels, indices
        return cifar()
    rejected("4.1", Mutant("integer offsets from range=[-0.5, 8.5], dtype=INT32", int_dtype_offsets,
                                  "crop offsets are uniform over 0..8", words="cuts the range's ends to integers"), [3])


def test_index_dtype_and_bgr_mean_named():
    """w11-04 x11: indices cast to uint32 were told about F.cross_entropy and class labels; w19: the
    mean alone in BGR order was told "64 of 64 samples match no 32x32 window"."""
    said = run_check("4.1", make_cifar_pipeline(index_dtype="UINT32"))
    assert said.status == "fail" and "labels and indices stay int64" in said.message, said.message
    assert "the indices (the third output)" in said.message and "cross_entropy" not in said.message, said.message
    for mean, std, words in ((CIFAR_MEAN255[::-1], CIFAR_STD255, "the mean is in BGR order"),
                             (CIFAR_MEAN255, CIFAR_STD255[::-1], "the std is in BGR order"),
                             ([120.0, 120.0, 120.0], CIFAR_STD255, "the mean is not CIFAR-10's")):
        said = run_check("4.1", make_cifar_pipeline(mean=mean, std=std))
        assert said.status == "fail" and "exact crop of its padded record, normalised" in said.message, said.message
        assert words in said.message and "not normalised as asked" in said.message, said.message
        assert "match no" not in said.message, said.message
