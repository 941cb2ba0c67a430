"""Optional integrations; each needs its extra installed (``django-safeupdates[drf]``...). The core
never imports them."""
