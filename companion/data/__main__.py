"""``python -m companion.data [--force] [NAME ...]``: build (or check) the derived corpus files.

With no NAME every corpus is prepared; files whose SHA-256 verifies are left alone unless ``--force``.
"""

from __future__ import annotations

import argparse

from companion.data.derived import CORPORA, prepare


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m companion.data", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"corpora to prepare (default: all of {', '.join(CORPORA)})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the files verify")
    parser.add_argument("--data-dir", default=None, help="directory holding derived/ (default: $COMPANION_DATA, "
                        "the checkout's data/, or ~/.cache/companion/data)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in CORPORA]
    if unknown:
        parser.error(f"NAME must be one of {', '.join(CORPORA)}; got {', '.join(unknown)}")
    try:
        prepare(args.names or None, data_dir=args.data_dir, force=args.force)
    except ValueError as e:  # a $COMPANION_DATA (or --data-dir) that is a file or cannot be written
        parser.exit(2, f"error: {e}\n")


if __name__ == "__main__":
    main()
