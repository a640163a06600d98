"""Everything of the SavedModel: its signature contract (signatures.py), the Translator
module that serves it, the merging of concurrent requests, its warm-up requests and the files
of an export (decoding.json, versions, the batching parameters), written and read here."""
