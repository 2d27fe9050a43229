"""`python -m course_utils.hub`: what `make hub` runs (see course_utils.hub.run)."""
from .run import main

raise SystemExit(main())
