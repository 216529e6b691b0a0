"""What every layer shares: row and frame contracts, stored codes, user errors,
secret masking, step rules and ranges, and the tree's plain rows.  Pure Python:
nothing here imports torch, polars or SQLAlchemy."""
