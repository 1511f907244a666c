# The two commands of the README: `make demo` and `make test`.
# Both install what they need on a fresh Debian machine (run as root).
PYTHON ?= python3
APT_PACKAGES = etcd-server etcd-client iproute2 iputils-ping iperf3 iptables nftables gcc clang libclang-rt-14-dev
STAMP = .deps-installed

.PHONY: deps test demo bench clean

$(STAMP): pyproject.toml setup.py csrc/*.c csrc/*.h csrc/build_ffi.py
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	$(PYTHON) -m pip install -q -e '.[test,perf]'
	@touch $(STAMP)

deps: $(STAMP)

test: deps
	$(PYTHON) -m pytest

demo: deps
	$(PYTHON) -m dataplane demo

bench: deps
	$(PYTHON) -m dataplane bench

clean:
	rm -rf build *.egg-info dataplane/_dataplane_c*.so dataplane/_dataplane_c.c $(STAMP)
