"""The episode store: every episode on disk (writer), read back as text (browser) or one HTML page (page)."""
