"""What a run writes and how: the `Recorder` interface (`recorder`), the records whose
fields are the results' columns (`records`), the Parquet parts, journal and results file
(`parquet`), the manifest and its file (`manifest`, `manifest_file`), resuming (`resume`),
where results live, a folder or an object-store URL (`location`), and the cache of step
calls (`cache`).

May import: `define` and the ground modules; no Prefect.
"""
