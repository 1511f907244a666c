"""`flannel-udp run`: the daemon, an orchestrator over the control plane, the host and the engines.

* ``main.py``        start order, the serve loop, shutdown;
* ``state.py``       the daemon's state (DaemonState), the small object its reports read, and
                     DaemonSource, that state as /metrics, /readyz and the status read it;
* ``options.py``     every setting, with its default (the CLI parses flanneld's flags into it);
* ``startup.py``     one function per start step, with the message an operator reads when it fails
                     (flannel0, the sockets and the engine: the dataplane's assembly,
                     host/assembly.py, in the daemon's words);
* ``early_load.py``  the kernel path's programs loaded in a thread while a fresh start talks to etcd;
* ``listing_ahead.py`` a fresh start's lease listing, made in a thread while it chooses its engine;
* ``peer_routes.py`` peer changes -> the engine's route table and DirectRouting's kernel routes;
* ``underlay_fallback.py`` the probes of the peers' IPv6 underlay, a failed one's IPv6 over IPv4;
* ``preflight.py``   what the host lacks (privileges, TUN, firewall tool, subnet.env, the port),
                     checked before anything is written to etcd;
* ``lease_keeper.py`` our lease while the daemon runs: the lease manager, SIGHUP, when to move;
* ``lease_move.py``  what moving to another lease does on a running host (SIGHUP, lease lost);
* ``blackhole_route.py`` the --ip-blackhole-route route, kept with the lease and checked on the tick;
* ``subnet_env.py``  subnet.env kept equal to the lease, rewritten on the tick while a write fails;
* ``host_forwarding.py`` the host's forwarding sysctls, read on the tick: warned while off, never set;
* ``status.py``      the status socket that `flannel-udp status` reads;
* ``monitor.py``     the serve loop's periodic checks and how often they log;
* ``liveness.py``    whether the serve loop and every engine loop progress: /healthz, WATCHDOG=1;
* ``peer_log.py``    peer changes in the log: a line per lease, or a summary per second in a burst;
* ``systemd.py``     READY=1 to systemd (sd_notify), its watchdog; ``fdstore.py`` its fd store (FDSTORE, LISTEN_FDS);
* ``inherited.py``   what a new daemon takes over from the previous one, and the checks;
* ``takeover.py``    keeping what is handed over (or not), and leaving the fds and the state to
                     the next process in systemd's fd store;
* ``handover.py``    the handover socket: --handover, systemctl reload (`flannel-udp reload`);
* ``succession.py``  what the handover is handed of the running daemon, and the state file;
* ``signals.py``     SIGTERM/SIGINT, SIGHUP, SIGUSR2 to the serve loop;
* ``http.py``        the /healthz, /readyz, /metrics and /debug/trace server;
* ``metrics.py``     the Prometheus collector, driven by the table of every series (DECLARED);
* ``metrics_text.py`` /metrics' text, each series' name and labels formatted once;
  ``cached_collector.py`` its process_* families, read from /proc once a second at most;
* ``interpreter.py`` the garbage collector paused until READY and a short switch interval, so that
                     the reports answer while the start keeps the CPU busy;
* ``timefmt.py``     a lease's expiry as the log and /readyz write it.
"""
