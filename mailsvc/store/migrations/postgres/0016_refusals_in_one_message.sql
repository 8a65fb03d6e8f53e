-- A statement that refuses a transaction by raising a check violation named after the rule it
-- breaks, so that a check whose answer nobody waits for (the sender domain of an email queued
-- alone) can travel with the rest of the transaction and its COMMIT in one message, and its
-- refusal still be told apart from any other error (see SqlVerbs.refuse_unless).
CREATE FUNCTION mailsvc_refuse(rule text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refused: %', rule USING ERRCODE = 'check_violation', CONSTRAINT = rule;
END
$$;
