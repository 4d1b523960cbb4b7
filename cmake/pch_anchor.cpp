// Anchors the precompiled header that every ptrain target reuses.
