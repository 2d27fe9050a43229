"""plotting.stamp: a long 'measured on' line never widens the figure (issue 28: it squeezed lesson
04's throughput axes to half their width, because the notebook saves figures with a tight box)."""
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from course_utils.plotting import bar_chart, stamp  # noqa: E402


def _tight_width(fig) -> int:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50, bbox_inches="tight")
    plt.close(fig)
    return Image.open(buf).size[0]


def test_a_long_stamp_wraps_inside_the_figure():
    label = ("simulated H100-class GPU (profile measured 2026-11-24), scaled x0.44 to this CPU (CPU: Intel(R) Xeon(R) "
             "Processor, 2 cores; one core loads 7,237 samples/s here, 3,157 on the H100 box's)")
    fig = bar_chart(["a", "b"], [1.0, 2.0], ylabel="samples/s", title="t", device=label, ceiling=2.5)
    width_in = fig.get_figwidth()
    lines = [t.get_text() for t in fig.texts if t.get_text().startswith("measured on")][0].count("\n") + 1
    assert lines >= 2
    assert _tight_width(fig) <= width_in * 50 * 1.05
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([0, 1])
    stamp(fig, "short")
    assert [t.get_text() for t in fig.texts] == ["measured on: short"]
    plt.close(fig)


def test_the_stamp_keeps_a_number_with_its_unit():   # w7-03: "... + 1500" / "GB/s; host 2 cores)"
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from course_utils.plotting import stamp
    fig = plt.figure(figsize=(6, 3))
    stamp(fig, "simulated accelerator (79.7 ms/step; on-device tensor work charged at 4 us/kernel + 1500 GB/s; "
               "host 2 cores)")
    text = fig.texts[-1].get_text()
    plt.close(fig)
    assert "1500 GB/s" in text and "\u00a0" not in text


def test_bar_chart_allow_cut_false_draws_every_bar_whole():
    """Lesson 04 (w9-04): DALI's 1-thread bar at 62,881 was cut beside its 2-thread bar at 18,245, and the
    two read 2:1 for 3.4:1; with allow_cut=False every bar is drawn to its value."""
    values = [2_000.0, 18_245.0, 62_881.0]
    cut = bar_chart(["a", "b", "c"], values, ylabel="samples/s", title="t", device="cpu")
    whole = bar_chart(["a", "b", "c"], values, ylabel="samples/s", title="t", device="cpu", allow_cut=False)
    assert cut.axes[0].patches[2].get_height() < values[2]
    assert [p.get_height() for p in whole.axes[0].patches] == values
    assert not any("bar cut" in t.get_text() for t in whole.axes[0].texts)
