"""The console's pages, one module per section; each has ``routes`` and ``NAV`` (see ``app.PAGES``)."""
