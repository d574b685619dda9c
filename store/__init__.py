"""What Shoal keeps on disk, in the data directory (--data-dir): record
files with checksums. Imports nothing of Shoal above it."""
