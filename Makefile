# Installing airlock from source (docs/install.md).
#
#   make                      release build of airlock and its helpers
#   make install              into /usr/local (PREFIX=..., DESTDIR=... for staging)
#   make install-systemd      the unit for `airlock serve`, pointing at $(PREFIX)/bin/airlock
#   make uninstall            removes what install and install-systemd put there
#   make deb                  the Debian package (deploy/debian/build-deb.sh)
#
# What goes where: `airlock` in $(PREFIX)/bin; its helpers in $(PREFIX)/libexec/airlock:
# the micro-VM guest agent (airlock-guest, a static executable), the gVisor agent (airlock-gvisor-agent) and
# the gVisor compat library (libairlock_gvisor_compat.so). airlock looks for them beside
# itself, in <exe dir>/../libexec/airlock, then in /usr/libexec/airlock.
#
# NO_BUILD=1 installs what is already built in $(BUILT) (the tests install a debug build
# that way: BUILT=target/debug NO_BUILD=1).

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec/airlock
SYSTEMDDIR ?= /etc/systemd/system
CARGO ?= cargo
PROFILE ?= release
BUILT ?= $(or $(CARGO_TARGET_DIR),target)/$(if $(filter dev,$(PROFILE)),debug,$(PROFILE))
NO_BUILD ?=
INSTALL ?= install

BIN := airlock
HELPERS := airlock-guest airlock-gvisor-agent libairlock_gvisor_compat.so
PACKAGES := -p airlock -p airlock-guest -p airlock-gvisor -p airlock-gvisor-compat
# The guest agent again, linked static (glibc's crt-static): the micro-VM's initramfs then
# holds no loader or library. Only its last link step runs again (the flag reaches
# no dependency, and needs none); stable cargo has no per-package rustflags.
GUEST_STATIC := -p airlock-guest --bin airlock-guest -- -C target-feature=+crt-static

.PHONY: all build install install-systemd uninstall deb

all: build

build:
ifeq ($(NO_BUILD),)
	$(CARGO) build --locked --profile $(PROFILE) $(PACKAGES)
	$(CARGO) rustc --locked --profile $(PROFILE) $(GUEST_STATIC)
else
	@for f in $(BIN) $(HELPERS); do \
		test -f "$(BUILT)/$$f" || { echo "make: $(BUILT)/$$f is not built (NO_BUILD is set)" >&2; exit 1; }; \
	done
endif

install: build
	$(INSTALL) -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBEXECDIR)"
	$(INSTALL) -m 0755 "$(BUILT)/airlock" "$(DESTDIR)$(BINDIR)/airlock"
	$(INSTALL) -m 0755 "$(BUILT)/airlock-guest" "$(DESTDIR)$(LIBEXECDIR)/airlock-guest"
	$(INSTALL) -m 0755 "$(BUILT)/airlock-gvisor-agent" "$(DESTDIR)$(LIBEXECDIR)/airlock-gvisor-agent"
	$(INSTALL) -m 0644 "$(BUILT)/libairlock_gvisor_compat.so" "$(DESTDIR)$(LIBEXECDIR)/libairlock_gvisor_compat.so"

# The unit names /usr/bin/airlock (the Debian package's path); here it names this prefix's.
install-systemd:
	$(INSTALL) -d "$(DESTDIR)$(SYSTEMDDIR)"
	sed 's|/usr/bin/airlock|$(BINDIR)/airlock|g' deploy/systemd/airlock.service > "$(DESTDIR)$(SYSTEMDDIR)/airlock.service"
	chmod 0644 "$(DESTDIR)$(SYSTEMDDIR)/airlock.service"

uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/airlock"
	rm -f $(addprefix "$(DESTDIR)$(LIBEXECDIR)/,$(addsuffix ",$(HELPERS)))
	rmdir "$(DESTDIR)$(LIBEXECDIR)" 2>/dev/null || true
	rm -f "$(DESTDIR)$(SYSTEMDDIR)/airlock.service"

deb: build
	deploy/debian/build-deb.sh "$(BUILT)"
