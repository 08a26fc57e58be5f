"""The six lab experiments; each returns a frozen result with ``.to_frame()`` (and ``.summary()``)."""
