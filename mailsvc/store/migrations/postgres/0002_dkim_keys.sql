-- Each domain carries its DKIM signing key, made when the domain is added.
ALTER TABLE domains ADD COLUMN dkim_selector text;
ALTER TABLE domains ADD COLUMN dkim_private_key text;
