"""The daemon's signals, said in the log as they arrive: SIGTERM and SIGINT stop it, SIGHUP
re-acquires the lease, SIGUSR2 starts the installed flannel-udp to take over (daemon/main.py
says what each does)."""
from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


def install(*, stop, reacquire: threading.Event, upgrade: threading.Event,
            wake: threading.Event) -> dict:
    """Handlers that call ``stop()``, or set ``reacquire`` (SIGHUP) or ``upgrade`` (SIGUSR2)
    and then ``wake`` (the serve loop's); returns the handlers they replaced, for
    :func:`restore`. Off the main thread (embedded use, tests) none: the caller stops the
    daemon itself."""
    def on_stop(signum, _frame):
        log.info("Received %s, shutting down (the lease is kept in etcd)",
                 signal.Signals(signum).name)
        stop()

    def hup(_signum, _frame):
        log.info("Received SIGHUP: re-acquiring the lease (peers are kept)")
        reacquire.set()
        wake.set()

    def usr2(_signum, _frame):
        log.info("Received SIGUSR2: starting the installed flannel-udp to take over")
        upgrade.set()
        wake.set()

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, fn)
            for sig, fn in ((signal.SIGTERM, on_stop), (signal.SIGINT, on_stop),
                            (signal.SIGHUP, hup), (signal.SIGUSR2, usr2))}


def restore(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)
