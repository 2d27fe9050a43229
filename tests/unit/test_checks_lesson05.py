"""Lesson 05 checks: right answers pass, typical wrong ones fail on the right property, stubs
report not_implemented."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_utils.checks import run_check
from course_utils.checks.lesson05 import _Probe, probe_budget


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 5.x")


def fails_on(exercise, fn, prop):
    result = run_check(exercise, fn)
    assert result.status == "fail", result.message
    assert f"'{prop}'" in result.message, result.message
    return result


# -- 5.1 ----------------------------------------------------------------------------------------

def amp_step(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def amp_no_autocast(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def amp_wrong_dtype(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    return amp_step(model, optimizer, scaler, images, labels, torch.bfloat16, max_norm)


def amp_unscaled_backward(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return loss.detach()


def amp_clip_before_unscale(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def amp_no_clip(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def amp_plain_optimizer_step(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return loss.detach()


def amp_no_update(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return loss.detach()


def amp_no_zero_grad(model, optimizer, scaler, images, labels, dtype=torch.float16, max_norm=1.0):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def test_amp_step_passes():
    result = run_check("5.1", amp_step)
    assert result.status == "pass", result.message


def test_amp_step_also_passes_returning_a_float():
    def as_float(*args, **kwargs):
        return amp_step(*args, **kwargs).item()
    assert run_check("5.1", as_float).status == "pass"


@pytest.mark.parametrize("fn, prop", [
    (amp_no_autocast, "runs the forward pass under autocast"),
    (amp_wrong_dtype, "autocasts to the dtype asked for"),
    (amp_unscaled_backward, "scales the loss before backward"),
    (amp_clip_before_unscale, "clips the unscaled gradients to max_norm"),
    (amp_no_clip, "clips the unscaled gradients to max_norm"),
    (amp_plain_optimizer_step, "skips the optimizer step when a gradient is inf"),
    (amp_no_update, "calls scaler.update() after each step"),
    (amp_no_zero_grad, "clears the gradients at the start of each step"),
])
def test_amp_step_wrong(fn, prop):
    fails_on("5.1", fn, prop)


def test_amp_step_stub_and_wrong_type():
    assert run_check("5.1", stub).status == "not_implemented"
    result = run_check("5.1", None)
    assert result.status == "fail" and "expected a function" in result.message


# -- 5.2 ----------------------------------------------------------------------------------------

def accumulate(model, loss_fn, images, labels, k):
    model.zero_grad(set_to_none=True)
    total = 0.0
    for xb, yb in zip(torch.tensor_split(images, k), torch.tensor_split(labels, k)):
        loss = loss_fn(model(xb), yb) * (len(xb) / len(images))
        loss.backward()
        total += loss.item()
    return total


def accumulate_divide_by_k(model, loss_fn, images, labels, k):
    model.zero_grad(set_to_none=True)
    total = 0.0
    for xb, yb in zip(torch.tensor_split(images, k), torch.tensor_split(labels, k)):
        loss = loss_fn(model(xb), yb) / k
        loss.backward()
        total += loss.item()
    return total


def accumulate_no_division(model, loss_fn, images, labels, k):
    model.zero_grad(set_to_none=True)
    total = 0.0
    for xb, yb in zip(torch.tensor_split(images, k), torch.tensor_split(labels, k)):
        loss = loss_fn(model(xb), yb)
        loss.backward()
        total += loss.item() * len(xb) / len(images)
    return total


def accumulate_no_zero(model, loss_fn, images, labels, k):
    total = 0.0
    for xb, yb in zip(torch.tensor_split(images, k), torch.tensor_split(labels, k)):
        loss = loss_fn(model(xb), yb) * (len(xb) / len(images))
        loss.backward()
        total += loss.item()
    return total


def accumulate_one_batch(model, loss_fn, images, labels, k):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(images), labels)
    loss.backward()
    return loss.item()


def accumulate_wrong_loss(model, loss_fn, images, labels, k):
    accumulate(model, loss_fn, images, labels, k)
    return 0.0


def test_accumulation_passes():
    result = run_check("5.2", accumulate)
    assert result.status == "pass", result.message


@pytest.mark.parametrize("fn, prop", [
    (accumulate_divide_by_k, "gives the gradient of the full batch"),
    (accumulate_no_division, "gives the gradient of the full batch"),
    (accumulate_no_zero, "gives the gradient of the full batch"),
    (accumulate_one_batch, "runs k micro-batches"),
    (accumulate_wrong_loss, "returns the full batch's loss"),
])
def test_accumulation_wrong(fn, prop):
    fails_on("5.2", fn, prop)


def test_accumulation_hints():
    assert "share of the samples" in run_check("5.2", accumulate_divide_by_k).message
    assert "zero_grad" in run_check("5.2", accumulate_no_zero).message
    assert "k times too big" in run_check("5.2", accumulate_no_division).message


def test_accumulation_stub():
    assert run_check("5.2", stub).status == "not_implemented"


# -- 5.3 ----------------------------------------------------------------------------------------

def largest(fits, cap):
    if not fits(1):
        return 0
    good, b = 1, 2
    while b <= cap and fits(b):
        good, b = b, 2 * b
    bad = min(b, cap + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def largest_linear(fits, cap):
    best = 0
    for b in range(1, cap + 1):
        if not fits(b):
            break
        best = b
    return best


def largest_plain_bisection(fits, cap):
    lo, hi = 0, cap          # fits(lo) (or lo == 0), answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_never_reaches_cap(fits, cap):
    if not fits(1):
        return 0
    good, b = 1, 2
    while b <= cap and fits(b):
        good, b = b, 2 * b
    bad = min(b, cap)          # off by one: cap itself is never tried
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def largest_probes_past_cap(fits, cap):
    good, b = 0, 1
    while fits(b):
        good, b = b, 2 * b
    return good


def largest_assumes_one_fits(fits, cap):
    good, b = 1, 2
    while b <= cap and fits(b):
        good, b = b, 2 * b
    bad = min(b, cap + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def largest_float_probe(fits, cap):
    return largest(lambda b: fits(b * 1.0), cap)


def test_largest_batch_passes():
    result = run_check("5.3", largest)
    assert result.status == "pass", result.message


@pytest.mark.parametrize("fn, prop", [
    (largest_linear, "uses few probes"),
    (largest_plain_bisection, "uses few probes"),
    (largest_never_reaches_cap, "finds the largest batch that fits"),
    (largest_probes_past_cap, "probes only valid batch sizes"),
    (largest_assumes_one_fits, "finds the largest batch that fits"),
    (largest_float_probe, "probes only valid batch sizes"),
])
def test_largest_batch_wrong(fn, prop):
    fails_on("5.3", fn, prop)


def test_largest_batch_stub():
    assert run_check("5.3", stub).status == "not_implemented"


def test_probe_and_budget():
    probe = _Probe(5, 10)
    assert probe(5) and not probe(6) and probe.calls == [5, 6]
    assert probe_budget(0) == 2 and probe_budget(1) == 4 and probe_budget(1000) == 22
    for threshold in range(0, 300):
        for cap in (max(threshold, 1), threshold + 1, 4096):
            p = _Probe(threshold, cap)
            assert largest(p, cap) == threshold
            assert len(p.calls) <= probe_budget(threshold), (threshold, cap, p.calls)


# -- 5.4 ----------------------------------------------------------------------------------------

def fixed_loop(model, optimizer, batches, loss_fn, log_every=10):
    means, window = [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        window.append(loss.detach())
        if step % log_every == 0:
            mean = torch.stack(window).mean().item()
            print(f"step {step}: mean loss {mean:.4f}")
            means.append(mean)
            window.clear()
    return means


def running_sum_loop(model, optimizer, batches, loss_fn, log_every=10):
    means, running = [], 0.0
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        running = running + loss.detach()
        if step % log_every == 0:
            means.append(float(running) / log_every)
            running = 0.0
    return means


def leaky_list_loop(model, optimizer, batches, loss_fn, log_every=10):
    means, history = [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        history.append(loss)
        if step % log_every == 0:
            means.append(torch.stack(history[-log_every:]).mean().item())
    return means


def undetached_running_sum(model, optimizer, batches, loss_fn, log_every=10):
    means, running = [], 0.0
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        running = running + loss
        if step % log_every == 0:
            means.append(running.item() / log_every)
            running = 0.0
    return means


def retain_graph_loop(model, optimizer, batches, loss_fn, log_every=10):
    means, window, outputs = [], [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = loss_fn(logits, labels)
        loss.backward(retain_graph=True)
        optimizer.step()
        outputs.append(logits)        # kept for an accuracy at the end: its graph keeps every buffer
        window.append(loss.detach())
        if step % log_every == 0:
            means.append(torch.stack(window).mean().item())
            window.clear()
    return means


def item_every_step(model, optimizer, batches, loss_fn, log_every=10):
    means, window = [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        window.append(loss.item())
        if step % log_every == 0:
            means.append(sum(window) / len(window))
            window.clear()
    return means


def print_every_step(model, optimizer, batches, loss_fn, log_every=10):
    means, window = [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        print(loss)
        window.append(loss.detach())
        if step % log_every == 0:
            means.append(torch.stack(window).mean().item())
            window.clear()
    return means


def empty_cache_every_step(model, optimizer, batches, loss_fn, log_every=10):
    means, window = [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()
        window.append(loss.detach())
        if step % log_every == 0:
            means.append(torch.stack(window).mean().item())
            window.clear()
    return means


def zeros_not_none(model, optimizer, batches, loss_fn, log_every=10):
    means, window = [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        window.append(loss.detach())
        if step % log_every == 0:
            means.append(torch.stack(window).mean().item())
            window.clear()
    return means


def last_loss_not_mean(model, optimizer, batches, loss_fn, log_every=10):
    means = []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            means.append(loss.item())
    return means


def returns_tensors(model, optimizer, batches, loss_fn, log_every=10):
    means, window = [], []
    for step, (images, labels) in enumerate(batches, 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        window.append(loss.detach())
        if step % log_every == 0:
            means.append(torch.stack(window).mean())
            window.clear()
    return means


def skips_steps(model, optimizer, batches, loss_fn, log_every=10):
    means, window = [], []
    for step, (images, labels) in enumerate(batches, 1):
        if step % 2:
            continue
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        window.append(loss.detach())
    n = (step) // log_every
    return [0.0] * n


def test_fixed_loop_passes():
    result = run_check("5.4", fixed_loop)
    assert result.status == "pass", result.message
    assert run_check("5.4", running_sum_loop).status == "pass"


@pytest.mark.parametrize("fn, prop", [
    (leaky_list_loop, "keeps no graph past its step"),
    (undetached_running_sum, "keeps no graph past its step"),
    (retain_graph_loop, "memory stays flat over the steps"),
    (item_every_step, "synchronises at most once per logging interval"),
    (print_every_step, "synchronises at most once per logging interval"),
    (empty_cache_every_step, "synchronises at most once per logging interval"),
    (zeros_not_none, "frees the gradients between steps"),
    (last_loss_not_mean, "logs the mean loss of each interval"),
    (returns_tensors, "returns Python floats"),
    (skips_steps, "trains on every batch"),
])
def test_fixed_loop_wrong(fn, prop):
    fails_on("5.4", fn, prop)


def test_fixed_loop_stub():
    assert run_check("5.4", stub).status == "not_implemented"
