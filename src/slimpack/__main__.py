"""``python -m slimpack`` (also what ``torchrun -m slimpack`` runs)."""

from slimpack.cli.main import main

raise SystemExit(main())
