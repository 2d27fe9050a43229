"""course_utils.progress: a progress line that ends on its final count (the shared finding of
w2-03: tqdm's notebook widget saved its first text, "0/21", in every headless run)."""
import course_utils.progress as progress_module
from course_utils.progress import progress


def test_outside_a_notebook_it_counts_every_item_and_ends_on_the_total(capsys):
    seen = list(progress(range(3), desc="three"))
    assert seen == [0, 1, 2]
    err = capsys.readouterr().err
    assert "three" in err and "3/3" in err


def test_in_a_notebook_the_last_line_drawn_is_the_final_count(monkeypatch):
    import IPython.display as ipd

    shown, updated = [], []
    monkeypatch.setattr(progress_module, "_in_a_notebook", lambda: True)
    monkeypatch.setattr(ipd, "display", lambda data, **kw: shown.append((data["text/plain"], kw["display_id"])))
    monkeypatch.setattr(ipd, "update_display", lambda data, **kw: updated.append((data["text/plain"], kw["display_id"])))
    bar = progress(total=21, desc="ceiling", mininterval=3600)    # no redraw while it runs: only at close
    for _ in range(21):
        bar.update(1)
    bar.close()
    bar.close()                                                   # a second close draws nothing more
    assert len(shown) == 1 and "0/21" in shown[0][0]
    assert len(updated) == 1 and "ceiling" in updated[0][0] and "21/21" in updated[0][0]
    assert updated[0][1] == shown[0][1], "the final count replaces the first line, it is not a second one"


def test_the_training_loop_ends_its_line_on_the_steps_it_ran(monkeypatch):
    import IPython.display as ipd

    from course_utils.sim import SimulatedAccelerator
    from course_utils.train import train
    import torch

    updated = []
    monkeypatch.setattr(progress_module, "_in_a_notebook", lambda: True)
    monkeypatch.setattr(ipd, "display", lambda data, **kw: None)
    monkeypatch.setattr(ipd, "update_display", lambda data, **kw: updated.append(data["text/plain"]))
    sim = SimulatedAccelerator(step_ms=0.5)
    try:
        batch = (torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
        train(None, [batch] * 6, device=sim, steps=5, desc="ceiling")
    finally:
        sim.close()
    assert updated and "5/5" in updated[-1]
    assert "ceiling, 1 warm-up + 4 timed" in updated[-1], "the line says which of its steps are timed"


def test_a_long_description_leaves_room_for_the_bar_and_the_rate():
    # w10-03: "best workers (1 step + 8 loaded ahead), 9 warm-up + 10 timed: 100%|█| 19/19 [00:04<00:00, "
    bar = progress_module.Progress(total=19, desc="best workers (1 step + 8 loaded ahead), 9 warm-up + 10 timed",
                                   mininterval=3600)
    bar.n = 19
    line = bar.line()
    bar.close()
    assert "19/19" in line and "it/s]" in line and "|" + "\u2588" * 5 in line, line
