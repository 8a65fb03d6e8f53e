"""Mail concerns: addresses, templates, DKIM, DNS records, and the MIME message."""
