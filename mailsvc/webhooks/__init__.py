"""Webhooks: what happened to an email, posted to the account's endpoints, signed as Standard
Webhooks specifies, retried until they answer 2xx, and never sent where they must not go."""
