"""The extended run: tests marked `extended` repeat what `make test` proves another way, at a cost CI
cannot pay on 2 cores (lessons 00, 01, 02 and 04, already run in the simulator, again on the CPU
device; lesson 04 at a faked 16 cores; the GPU check's dry run; check 2.2 timed beside a busy core and
on a quiet machine; 8.1's far-below pipeline on a busy machine). `make test-all` (COURSE_EXTENDED=1) runs them; run it
before a release and after changing what they cover."""
import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("COURSE_EXTENDED") == "1":
        return
    skip = pytest.mark.skip(reason="extended run only: `make test-all` (COURSE_EXTENDED=1) runs it")
    for item in items:
        if item.get_closest_marker("extended"):
            item.add_marker(skip)
