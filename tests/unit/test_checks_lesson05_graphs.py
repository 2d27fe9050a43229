"""Check 5.5 (a training step captured as a CUDA graph): every case of graph_step_cases.py (the right
answers and the wrong ones, as data) gets its verdict on every seed, each wrong one on the property it
breaks; and the emulated capture (course_utils.graph_capture) keeps the rules it lists."""
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.checks import run_check
from course_utils.checks.lesson05_graphs import grade_scenario
from course_utils.checks.virtual_cuda_training import VirtualCudaTraining
from course_utils.graph_capture import CAPTURE_ERROR, RULES, EmulatedGraphs

from graph_step_cases import _BY_ID, CASES, caches_by_model_and_optimizer_id, right
from mutants import Mutant, passes, rejected

SEEDS = range(2)
CHECKED = [c for c in CASES if c.optimizer == "sgd"]          # what check 5.5 itself grades
SCENARIO_ONLY = [c for c in CASES if c.optimizer != "sgd"]    # another optimizer: one scenario


@pytest.mark.parametrize("case", CHECKED, ids=repr)
def test_check_55_gives_each_case_its_verdict(case):
    if case.expected == "pass":
        passes("5.5", case.answer, SEEDS)
    else:
        rejected("5.5", Mutant(case.name, case.answer, case.prop if case.expected == "fail" else case.words,
                               status=case.expected, words=case.words), SEEDS)


@pytest.mark.parametrize("case", SCENARIO_ONLY, ids=repr)
def test_other_optimizers_as_on_a_gpu(case):
    for seed in SEEDS:
        verdict = grade_scenario(case.answer, "cpu", seed=seed, optimizer=case.optimizer)
        assert verdict.status == case.expected, verdict
        assert case.words in verdict.message, verdict


def test_a_step_cached_by_model_and_optimizer_id_is_caught_on_the_second_call():
    """Walk w9-05 (w55_24): a step kept per (id(model), id(optimizer)) passed every scenario; the check calls
    make_graphed_step again with the same model and optimizer. The cache is emptied first: a freed model's id
    can come back, and then the first call already hands back a stale graph (another message)."""
    mutant = Mutant("a step cached per (id(model), id(optimizer))", caches_by_model_and_optimizer_id,
                    "captures a graph of the model it is given, in every call",
                    words="the second call returned the very step function the first call returned: state kept "
                          "between calls")
    for seed in SEEDS:
        _BY_ID.clear()
        rejected("5.5", mutant, [seed])
    _BY_ID.clear()


def test_the_right_answer_passes_twice_in_one_process():
    for _ in range(2):
        result = run_check("5.5", right)
        assert result.status == "pass", result.message
    assert "virtual CUDA device" in result.message


def test_stub_and_wrong_type():
    def stub(model, optimizer, example_images, example_labels, warmup=3):
        raise NotImplementedError("Exercise 5.5")
    assert run_check("5.5", stub).status == "not_implemented"
    assert run_check("5.5", 42).status == "fail"


def test_the_solution_notebook_answer_is_a_case():
    """The lesson's own answer is graded like `right` (the notebooks test runs it for real)."""
    assert any(c.answer is right and c.expected == "pass" for c in CASES)


# -- the emulated capture keeps its rules --------------------------------------------------------

def test_a_capture_runs_nothing_and_a_replay_runs_it_on_the_captured_memory():
    with EmulatedGraphs() as graphs:
        x = torch.ones(3)
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            y = x * 2
            x.mul_(2)
        assert torch.equal(x, torch.ones(3)), "a capture records; it does not run"
        assert torch.isnan(y).all(), "what a capture made holds nothing until the first replay"
        g.replay()
        g.replay()
        assert torch.equal(x, torch.full((3,), 4.0)) and torch.equal(y, torch.full((3,), 4.0))
        assert graphs.graphs[0].replays == 2
        x.data = torch.zeros(3)                  # rebound: the graph keeps the captured storage
        g.replay()
        assert torch.equal(x, torch.zeros(3)) and torch.equal(y, torch.full((3,), 8.0))


@pytest.mark.parametrize("read", [lambda t: t.sum().item(), lambda t: print(t), lambda t: t.cpu(),
                                  lambda t: t.tolist(), lambda t: torch.cuda.synchronize(),
                                  lambda t: torch.cuda.Event().synchronize(), lambda t: bool(t.sum() > 0),
                                  lambda t: t[t > 0]],
                         ids=["item", "print", "cpu", "tolist", "synchronize", "event.synchronize", "if", "mask"])
def test_host_reads_while_capturing_raise_cudas_error(read, capsys):
    with EmulatedGraphs():
        x = torch.ones(3)
        with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                read(x * 2)
        read(x)                                  # outside a capture: allowed


def test_capture_arguments_and_refusals_as_torch_gives_them():
    with EmulatedGraphs():
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="Unknown capture error mode"):
            with torch.cuda.graph(g, capture_error_mode="strict"):
                pass
        with pytest.raises(TypeError, match="unexpected keyword argument 'poll'"):
            torch.cuda.graph(g, poll=None)
        with pytest.raises(RuntimeError, match="non-default stream"):
            g.capture_begin()
        pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(g, pool=pool, capture_error_mode="relaxed", enable_annotations=False):
            assert torch.cuda.is_current_stream_capturing()
            with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
                with torch.cuda.graph(torch.cuda.CUDAGraph()):      # it synchronizes first, as torch's does
                    pass
            with pytest.raises(RuntimeError, match="already underway"):
                torch.cuda.CUDAGraph().capture_begin()
        assert g.capture_error_mode == "relaxed" and g.pool_token == pool and not torch.cuda.is_current_stream_capturing()
        with pytest.raises(RuntimeError, match="already owns a captured graph"):
            with torch.cuda.graph(g):
                pass


def test_an_optimizer_that_is_not_capturable_refuses_as_on_a_gpu():
    w = nn.Parameter(torch.ones(3))
    for capturable, refused in ((False, True), (True, False)):
        with VirtualCudaTraining() as vc:
            vc.put(w)
            opt = torch.optim.Adam([w], lr=0.1, capturable=capturable)
            w.grad = torch.ones(3, device="cuda")
            opt.step()                                          # warm-up: the state exists
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    opt.step()
                raised = None
            except RuntimeError as exc:
                raised = str(exc)
        assert (raised is not None) == refused, raised
        if refused:
            assert "capturable is False" in raised and "Adam" in raised


def test_make_graphed_callables_runs_on_the_emulation():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    graphed = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    graphed.load_state_dict(eager.state_dict())
    x = torch.randn(4, 5)
    with EmulatedGraphs() as graphs:
        graphed = torch.cuda.make_graphed_callables(graphed, (x.clone(),))
        for _ in range(2):
            batch = torch.randn(4, 5)
            for model in (eager, graphed):
                model.zero_grad(set_to_none=True)
                model(batch).square().sum().backward()
            for a, b in zip(eager.parameters(), graphed.parameters()):
                assert torch.allclose(a.grad, b.grad, atol=1e-6)
    assert len(graphs.graphs) == 2 and all(g.replays == 2 for g in graphs.graphs)


def test_replays_draw_new_random_numbers_and_host_numbers_are_frozen():
    with VirtualCudaTraining():
        x = torch.ones(1000, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dropped = F.dropout(x, 0.5)
            host = torch.rand(3)                              # drawn on the host: once, at capture
        g.replay()
        first, drawn = dropped.clone(), host.clone()
        g.replay()
        assert not torch.equal(first, dropped), "each replay draws anew (CUDA's graph-safe generator)"
        assert torch.equal(host, drawn), "host work is not captured"


def test_pinning_during_a_capture_fails_in_global_mode_only():
    for mode, refused in (("global", True), ("thread_local", False), ("relaxed", False)):
        errors = []
        with VirtualCudaTraining():
            x = torch.ones(3, device="cuda")
            started, captured = threading.Event(), threading.Event()

            def pin():
                started.wait()
                try:
                    torch.empty(8).pin_memory()
                except RuntimeError as exc:
                    errors.append(str(exc))
                finally:
                    captured.set()
            worker = threading.Thread(target=pin)
            worker.start()
            with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode=mode):
                x.mul_(2)
                started.set()
                captured.wait(10)
            worker.join(10)
        assert bool(errors) == refused, (mode, errors)
        if refused:
            assert CAPTURE_ERROR in errors[0] and "another thread" in errors[0]


def test_the_rules_say_what_a_gpu_does_and_what_the_emulation_does():
    assert len(RULES) >= 10 and all(r.rule and r.gpu and r.emulation for r in RULES)
    assert any("storage" in r.emulation for r in RULES) and any("capturable" in r.gpu for r in RULES)


def test_the_courses_graphed_step_captures_beside_a_pinning_thread():
    """train(cuda_graph=True) captures mid-loop, while a loader's pinning thread may allocate pinned
    memory: on the warm-up's stream, in capture_error_mode='thread_local', it trains as eager steps do."""
    from course_utils.train import GRAPH_WARMUP, train
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).double()
    graphed = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).double()
    graphed.load_state_dict(eager.state_dict())
    batches = [(torch.randn(5, 3, 8, 8, dtype=torch.float64), torch.randint(0, 3, (5,))) for _ in range(7)]
    expected = train(eager, batches, device="cpu", progress=False).losses
    stop = threading.Event()

    def pinning():
        while not stop.is_set():
            torch.empty(16).pin_memory()
    with VirtualCudaTraining() as vc:
        vc.put_module(graphed)
        for b in batches:
            vc.put(b[0]), vc.put(b[1])
        worker = threading.Thread(target=pinning)
        worker.start()
        try:
            losses = train(graphed, batches, device="cuda", progress=False, cuda_graph=True).losses
        finally:
            stop.set()
            worker.join(10)
        (graph,) = vc.graphs.graphs
    assert graph.capture_error_mode == "thread_local" and graph.replays == len(batches) - GRAPH_WARMUP
    assert losses == pytest.approx(expected, rel=1e-9)


def test_streams_order_the_work_and_a_replay_that_races_the_caller_is_logged():
    """x-05 F3: streams made by torch.cuda.Stream() run concurrently with the default stream on a GPU."""
    for ordered in (False, True):
        with EmulatedGraphs() as graphs:
            x = torch.ones(3)
            side = torch.cuda.Stream()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=side):
                y = x * 2
            x.copy_(torch.full((3,), 5.0))                    # the default stream writes the input
            if ordered:
                side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                g.replay()
            if ordered:
                torch.cuda.current_stream().wait_stream(side)
            out = y.clone()                                   # the default stream reads the output
        assert torch.equal(out, torch.full((3,), 10.0))
        assert bool(graphs.races) != ordered, graphs.races
        if not ordered:
            assert "the graph's replay on side stream" in str(graphs.races[0]) and "read" in str(graphs.races[0])
    with EmulatedGraphs() as graphs:                          # an event, and a host wait, order work too
        x = torch.ones(3)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.mul_(2)
            done = torch.cuda.Event()
            done.record()
        torch.cuda.current_stream().wait_event(done)
        x.add_(1)
        with torch.cuda.stream(side):
            x.mul_(2)
        torch.cuda.synchronize()
        x.add_(1)
    assert len(graphs.races) == 1, graphs.races              # only the side stream's write after the default's add_
    assert str(graphs.races[0]).startswith("mul_ on side stream") and "add_ on the default stream" in str(graphs.races[0])


def test_capture_end_on_another_stream_raises_torchs_error():
    with EmulatedGraphs():
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            g.capture_begin()
            torch.ones(2) * 2
        with pytest.raises(RuntimeError, match="Capture must end on the same stream it began on."):
            g.capture_end()


def test_a_capture_checks_no_value_and_freezes_host_scalars():
    """x-05 F5, F8: nothing runs at capture (labels out of range in an unfilled buffer are fine); a 0-dim
    host tensor is an argument of the kernel, read at capture; a device tensor is read at each replay."""
    with VirtualCudaTraining() as vc:
        logits = torch.randn(4, 3, device="cuda")
        labels = torch.full((4,), 1000, dtype=torch.long, device="cuda")     # garbage until the first copy_
        host_lr, device_lr = torch.tensor(0.5), torch.tensor(0.5, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            loss = F.cross_entropy(logits, labels)
            frozen, read = logits * host_lr, logits * device_lr
        labels.copy_(torch.tensor([0, 1, 2, 0]).to("cuda"))
        host_lr.fill_(10.0)
        device_lr.fill_(10.0)
        g.replay()
        with vc.quiet():
            assert torch.isfinite(loss) and torch.allclose(loss, F.cross_entropy(logits, labels))
            assert torch.allclose(frozen, logits * 0.5) and torch.allclose(read, logits * 10.0)


@pytest.mark.parametrize("call, message", [
    (lambda x: x[[0, 2]], "indexing with a Python list"),
    (lambda x: torch.cuda.manual_seed(1), "set_current_seed during CUDA graph capture"),
    (lambda x: torch.manual_seed(1), "set_current_seed during CUDA graph capture"),
    (lambda x: torch.rand(3, generator=torch.Generator(), device="cuda"), "generator not in capture mode"),
    (lambda x: torch.cuda.Event().query(), "event.query inside the capture"),
    (lambda x: torch.accelerator.synchronize(), "not permitted when stream is capturing"),
], ids=["list index", "cuda.manual_seed", "manual_seed", "unregistered generator", "query", "accelerator sync"])
def test_what_torch_refuses_while_capturing(call, message):
    with VirtualCudaTraining():
        x = torch.arange(4.0, device="cuda")
        with pytest.raises(RuntimeError, match=message):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                call(x)
        call(x)                                                   # outside a capture: allowed


def test_a_registered_generator_draws_anew_each_replay_and_query_is_no_wait():
    with VirtualCudaTraining() as vc:
        gen = torch.Generator().manual_seed(0)
        g = torch.cuda.CUDAGraph()
        g.register_generator_state(gen)
        with torch.cuda.graph(g):
            r = torch.rand(8, generator=gen, device="cuda")
        g.replay()
        with vc.quiet():
            first = r.clone()
        g.replay()
        event = torch.cuda.Event()
        event.record()
        assert event.query() and torch.cuda.current_stream().query()
        assert vc.syncs[-1].what == "torch.cuda.synchronize", vc.syncs     # torch.cuda.graph's own, not query's
        with vc.quiet():
            assert not torch.equal(first, r)


def test_the_device_agnostic_and_module_names_are_emulated():
    """x-05 F6: torch.cuda.graphs.*, torch.cuda.streams.*, torch.Stream/Event, torch.accelerator."""
    with VirtualCudaTraining() as vc:
        x = torch.ones(3, device="cuda")
        side = torch.Stream(device=x.device)
        assert isinstance(side, torch.Stream) and isinstance(torch.cuda.streams.Stream(), torch.cuda.Stream)
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            x.mul_(2)
        torch.accelerator.current_stream().wait_stream(side)
        g = torch.cuda.graphs.CUDAGraph()
        with torch.cuda.graphs.graph(g):
            y = x + 1
        g.replay()
        torch.accelerator.synchronize()
        assert [s.what for s in vc.syncs] == ["torch.cuda.synchronize"] * 2 and torch.accelerator.is_available()
        assert torch.accelerator.current_accelerator().type == "cuda" and not vc.graphs.races
        with vc.quiet():
            assert torch.equal(y, torch.full((3,), 3.0))
        if hasattr(torch.accelerator, "Graph"):
            with pytest.raises(RuntimeError, match="only torch.cuda's graph API is"):
                torch.accelerator.Graph()


def test_the_courses_graphed_step_captures_fp16_with_a_fused_optimizer_only():
    """x-05 F11: a fused optimizer takes GradScaler's scale and inf flag as device tensors, so the scaler is
    captured with the step; any other optimizer reads the flag on the host every step: refused."""
    import warnings

    from course_utils.train import train
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    graphed = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    graphed.load_state_dict(eager.state_dict())
    batches = [(torch.randn(5, 3, 8, 8), torch.randint(0, 3, (5,))) for _ in range(6)]
    runs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # CUDA autocast on the virtual device's CPU tensors: a no-op
        for model, cuda_graph in ((eager, False), (graphed, True)):
            with VirtualCudaTraining() as vc:
                vc.put_module(model)
                for b in batches:
                    vc.put(b[0]), vc.put(b[1])
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
                runs.append(train(model, batches, device="cuda", progress=False, amp="fp16", optimizer=opt,
                                  cuda_graph=cuda_graph).losses)
                assert not vc.graphs.races
        assert runs[1] == pytest.approx(runs[0], rel=1e-6)
        with pytest.raises(ValueError, match="fused optimizer only"):
            train(graphed, batches, device="cuda", progress=False, amp="fp16", cuda_graph=True,
                  optimizer=torch.optim.SGD(graphed.parameters(), lr=0.1))


def labels_copied_before_the_shape_check(model, optimizer, example_images, example_labels, warmup=3):
    """The labels copied into the graph's input when their shape fits, before the images' shape is compared
    (w7-05 w55_17): the ValueError comes, but the refused call has changed the graph's input."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(example_images), example_labels).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    static_images, static_labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph, stream=side):
        static_loss = F.cross_entropy(model(static_images), static_labels)
        static_loss.backward()
        optimizer.step()

    def step(images, labels):
        if labels.shape == static_labels.shape:
            static_labels.copy_(labels)
        if images.shape != static_images.shape or labels.shape != static_labels.shape:
            raise ValueError("a graph replays the shapes it captured")
        static_images.copy_(images)
        static_labels.copy_(labels)
        graph.replay()
        return static_loss.detach().clone()
    return step


def images_copied_before_the_labels_are_compared(model, optimizer, example_images, example_labels, warmup=3):
    """The near miss on the other side: the images copied once their shape fits, then the labels compared."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(example_images), example_labels).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    static_images, static_labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph, stream=side):
        static_loss = F.cross_entropy(model(static_images), static_labels)
        static_loss.backward()
        optimizer.step()

    def step(images, labels):
        if images.shape != static_images.shape:
            raise ValueError("a graph replays the shapes it captured")
        static_images.copy_(images)
        if labels.shape != static_labels.shape:
            raise ValueError("a graph replays the shapes it captured")
        static_labels.copy_(labels)
        graph.replay()
        return static_loss.detach().clone()
    return step


@pytest.mark.parametrize("mutant", [
    Mutant("labels copied before the shape check (w55_17)", labels_copied_before_the_shape_check,
           "a batch of another shape raises ValueError and changes nothing",
           words="had copied the labels into the graph's input tensors"),
    Mutant("images copied before the labels are compared", images_copied_before_the_labels_are_compared,
           "a batch of another shape raises ValueError and changes nothing",
           words="had copied the images into the graph's input tensors")], ids=repr)
def test_a_refused_batch_changes_nothing(mutant):
    """Both refused cases that copy_ would take on one side (same-shape labels, same-shape images) are in every
    seed's draw, so either order of a copy made before the comparison fails (w7-05 w55_17)."""
    rejected("5.5", mutant, range(1))


def labels_compared_by_their_number(model, optimizer, example_images, example_labels, warmup=3):
    """Labels compared by numel() and reshaped with view_as (walk w8-05, 55_labels_numel_only): a column of
    labels, (N, 1), is taken without a word, though the contract says another layout raises ValueError."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(example_images), example_labels).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    static_images, static_labels = example_images.clone(), example_labels.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph, stream=side):
        static_loss = F.cross_entropy(model(static_images), static_labels)
        static_loss.backward()
        optimizer.step()

    def step(images, labels):
        if images.shape != static_images.shape or labels.numel() != static_labels.numel():
            raise ValueError("a graph replays the shapes it captured")
        static_images.copy_(images)
        static_labels.copy_(labels.view_as(static_labels))
        graph.replay()
        return static_loss.detach().clone()
    return step


def test_labels_in_another_layout_are_refused():
    """The column of labels is in every seed's draw (the refused cases take no draw of their own)."""
    rejected("5.5", Mutant("labels compared by numel(), reshaped with view_as", labels_compared_by_their_number,
                           "a batch of another shape raises ValueError", words="labels laid out as a column"), range(1))
