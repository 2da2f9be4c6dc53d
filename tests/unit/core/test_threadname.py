"""set_os_thread_name: the kernel's name of the calling thread, cut to 15 bytes."""

from __future__ import annotations

import os
import threading

from fireflyer.core.threadname import OS_NAME_MAX, set_os_thread_name


def _comm(tid: int) -> str:
    with open(f"/proc/{os.getpid()}/task/{tid}/comm") as f:
        return f.read().strip()


def test_names_the_calling_thread_only_and_cuts_to_what_the_kernel_keeps() -> None:
    got: dict[str, object] = {}

    def body() -> None:
        got["ok"] = set_os_thread_name("read-12-t0-n11-and-more")
        got["tid"] = threading.get_native_id()

    main_before = _comm(threading.get_native_id())
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert got["ok"] is True
    assert _comm(threading.get_native_id()) == main_before  # the caller's thread alone


def test_a_named_thread_reads_back_its_name() -> None:
    seen: list[str] = []
    done = threading.Event()
    release = threading.Event()

    def body() -> None:
        set_os_thread_name("down-3-t1-n2-and-more")
        seen.append(_comm(threading.get_native_id()))
        done.set()
        release.wait(5)

    t = threading.Thread(target=body)
    t.start()
    done.wait(5)
    release.set()
    t.join()
    assert seen == ["down-3-t1-n2-an"] and len(seen[0]) == OS_NAME_MAX
