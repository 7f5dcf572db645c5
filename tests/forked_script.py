"""``python -m tests.forked_script CODE``: runs CODE (tests/test_forked.py)."""
import sys

if __name__ == "__main__":
    exec(sys.argv[1])
