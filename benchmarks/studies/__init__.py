"""One-off investigations, apart from the suite: see README.md beside this file."""
