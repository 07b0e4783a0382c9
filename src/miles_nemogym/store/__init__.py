"""The episode store: every episode on disk (writer), read back (reader), shown as text
(browser) or as one HTML page (page)."""
