"""Resident memory, for the tests that check that 10^5 calls leak nothing."""
import os

# Under make test-python-asan the interpreter preloads ASan, whose quarantine keeps freed memory
# resident: there RSS says nothing about leaks (ASan checks the accesses; the release run, RSS).
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def check_rss_growth(before, limit_bytes):
    """Fails when resident memory grew by `limit_bytes` or more since `before` (not under ASan)."""
    grown = rss_bytes() - before
    assert UNDER_ASAN or grown < limit_bytes, f"resident memory grew by {grown} bytes"
