"""Guards of the repository's shape, about no single package: they read every package (imports,
sizes, public names, contract spellings, what the wheel ships) or the tests themselves, and fail
when the shape drifts. Kept apart from tests/unit/ because their subject is the whole checkout."""
