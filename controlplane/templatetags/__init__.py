"""The dashboard's template filters (Django finds them here by convention): safe
Markdown, relative times, durations."""
