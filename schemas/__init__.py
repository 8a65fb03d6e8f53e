"""The JSON Schemas of request bodies (data). A package only so they install with mailsvc."""
