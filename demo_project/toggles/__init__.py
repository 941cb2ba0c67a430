"""The demo app: a ``Profile`` per user whose toggles are written by queued jobs through safeupdates."""
