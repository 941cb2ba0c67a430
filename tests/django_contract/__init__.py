"""Django's own tests of save() and delete(), ported onto models that use ``LockVersionMixin``."""
