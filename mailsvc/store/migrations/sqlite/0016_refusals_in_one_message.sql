-- Nothing on SQLite: its writer answers each statement at once, so a check that refuses a
-- transaction is read there and then (see SqlVerbs.refuse_unless). The number is kept so that
-- both backends number their migrations alike.
SELECT 1;
