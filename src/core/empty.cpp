// Keeps libraries that may have no other source yet non-empty.
