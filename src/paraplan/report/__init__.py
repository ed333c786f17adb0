"""Reports: terminal tables, JSON, Perfetto traces."""
