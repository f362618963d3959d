"""How the ``paramserver`` command's process ends (``cli/main.command``): with ``main``'s code,
everything it printed flushed and the exit handlers run, but without Python's teardown of its
modules; a thread still running is waited for as Python's own exit waits.  Each case runs the
console entry in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

PRELUDE = ("import atexit, sys, threading, time\n"
           "from paramserver.cli.main import command\n"
           "atexit.register(lambda: print('exit handlers ran', file=sys.stderr))\n")


def _run(body: str, *argv: str, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + f"sys.argv = ['paramserver', *{list(argv)!r}]\n" + body + "command()\n"
    return subprocess.run([sys.executable, "-c", script], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


def test_help_is_printed_whole_and_the_exit_handlers_run():
    done = _run("", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: paramserver")
    assert done.stdout.rstrip().endswith("DMLC_NODE_HOST"), done.stdout[-200:]  # the epilog's last word: all of it
    assert "exit handlers ran" in done.stderr


def test_a_usage_error_keeps_its_code_and_message():
    done = _run("", "train", "--no-such-flag")
    assert done.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in done.stderr
    assert "exit handlers ran" in done.stderr


def test_a_commands_own_code_and_output_survive_the_fast_exit(tmp_path):
    out = tmp_path / "rows.tsv"
    done = _run("", "synth", "--rows", "500", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert len(out.read_text().splitlines()) == 500  # closed whole before the process ended
    assert "wrote 500 rows" in done.stdout + done.stderr


def test_a_thread_still_running_is_waited_for():
    body = ("def late():\n"
            "    time.sleep(0.3)\n"
            "    print('the thread finished', flush=True)\n"
            "threading.Thread(target=late).start()\n")
    done = _run(body, "--version")
    assert done.returncode == 0, done.stderr
    assert "the thread finished" in done.stdout
    assert "exit handlers ran" in done.stderr


def test_a_reader_that_stops_early_gets_no_traceback():
    # `paramserver ... | head -c 0`: what the command printed is still in its buffer when the
    # reader has gone, and the last flush finds the pipe closed
    script = PRELUDE + ("time.sleep(0.5)\n"
                        "sys.argv = ['paramserver', '--version']\n"
                        "command()\n")
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    writer.stdout.close()
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert "exit handlers ran" in err


def test_what_a_socket_still_holds_is_delivered_before_the_process_ends():
    """A socket closed with a linger hands its queue to ZeroMQ's I/O thread; ``os._exit`` would
    end that thread with the queue unsent (a scheduler's reply to SHUTDOWN, lost on CI)."""
    import zmq

    ctx = zmq.Context()
    inbox = ctx.socket(zmq.ROUTER)
    inbox.linger = 0
    try:
        port = inbox.bind_to_random_port("tcp://127.0.0.1")
        body = ("import zmq\n"
                "sock = zmq.Context.instance().socket(zmq.DEALER)\n"
                f"sock.connect('tcp://127.0.0.1:{port}')\n"
                "sock.send(b'x' * (64 << 20))\n"  # more than the kernel's buffers take at once
                "sock.close(linger=30000)\n")
        done = _run(body, "--version")
        assert done.returncode == 0, done.stderr
        assert inbox.poll(30_000), "the queued message never arrived"
        _, got = inbox.recv_multipart()
        assert len(got) == 64 << 20
    finally:
        inbox.close()
        ctx.term()


def test_the_end_waits_for_a_zap_handler_without_aborting(tmp_path):
    """A CurveZMQ node's ZAP thread reads a socket of the shared context: the end wakes it
    (it closes its socket) instead of closing the socket under it, and does not wait the bound."""
    body = ("import zmq\n"
            "from paramserver.wire.ending import deliver_queued\n"
            "from paramserver.wire.security import keygen, secure_server\n"
            f"keys = keygen({str(tmp_path / 'keys')!r})\n"
            "sock = zmq.Context.instance().socket(zmq.ROUTER)\n"
            "secure_server(sock, keys)\n"
            "sock.bind('tcp://127.0.0.1:0')\n"
            "sock.close(linger=0)\n"
            "print('ended in time:', deliver_queued(10.0), flush=True)\n")
    done = _run(body, "--version")
    assert done.returncode == 0, done.stderr
    assert "ended in time: True" in done.stdout, done.stdout + done.stderr


def test_keep_dashboard_ends_on_a_ctrl_c_the_kernel_hands_to_another_thread():
    """A process-directed SIGINT may land on any thread that does not block it (an I/O or a
    dashboard thread): ``--keep-dashboard``'s wait still ends within a moment, where a lock's
    wait slept through it for ever (a process test hung 60 s)."""
    import signal
    import threading
    import time
    from types import SimpleNamespace

    from paramserver.cli.ctr import _linger

    main = threading.get_ident()
    done = threading.Event()

    def ctrl_c_elsewhere():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # on this thread, not the main one
        if not done.wait(5):
            signal.pthread_kill(main, signal.SIGINT)  # the old wait: end it so the test reports, not hangs

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as the command has it (not whatever
    try:  # an earlier test in this process left)
        threading.Thread(target=ctrl_c_elsewhere, daemon=True).start()
        start = time.monotonic()
        _linger(SimpleNamespace(where=["dashboard http://127.0.0.1:1/"]))
        done.set()
    finally:
        signal.signal(signal.SIGINT, before)
    assert time.monotonic() - start < 2.5


def test_a_reader_that_stops_mid_command_ends_it_quietly_with_sigpipes_code():
    """``paramserver synth --out - | head -1``: the command's writes find the pipe closed
    part way; it ends with 141 (a shell's code for SIGPIPE), printing no error or traceback."""
    writer = subprocess.Popen([sys.executable, "-m", "paramserver", "synth", "--rows", "200000", "--out", "-"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    assert writer.stdout.readline()  # a first row came
    writer.stdout.close()
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=120) == 141, err
    assert "error" not in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_a_broken_pipe_that_is_not_standard_output_is_still_an_error(monkeypatch, capsys):
    from paramserver.cli import main as cli_main

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli_main.COMMANDS, "synth", cli_main.COMMANDS["synth"]._replace(run=broken))
    assert cli_main.main(["synth", "--rows", "1", "--out", "-"]) == 2
    assert "error: [Errno 32] Broken pipe" in capsys.readouterr().err
