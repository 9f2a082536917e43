-- Search (src/store/search.rs) looks for text in header names and values, not in the
-- stored encoding around them (src/headers.rs: a 4-byte length before each name and
-- value): a value of 37 bytes is preceded by the byte 0x25, `%`, which a search for `%`
-- matched. Whether one of the names or values of `headers` holds `text`; a record cut
-- short is read as far as it goes, and a malformed length ends the walk (a row written
-- by hand must not stop a search).
CREATE OR REPLACE FUNCTION recovery_headers_hold(headers bytea, text bytea)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    total int := length(headers);
    at int := 0;   -- offset of the next length, from 0 as get_byte counts
    part bigint;
    value_part boolean := false;
BEGIN
    WHILE at + 4 <= total LOOP
        part := (get_byte(headers, at)::bigint << 24) | (get_byte(headers, at + 1) << 16)
              | (get_byte(headers, at + 2) << 8) | get_byte(headers, at + 3);
        at := at + 4;
        IF value_part AND part = 4294967295 THEN
            part := 0;            -- a header without a value
        ELSIF value_part AND part > 2147483647 THEN
            RETURN false;         -- a negative length: malformed
        END IF;
        part := least(part, total - at);
        IF part > 0 AND position(text IN substring(headers FROM at + 1 FOR part::int)) > 0 THEN
            RETURN true;
        END IF;
        at := at + part::int;
        value_part := NOT value_part;
    END LOOP;
    RETURN false;
END
$$;
