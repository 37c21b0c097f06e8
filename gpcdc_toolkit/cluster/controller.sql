-- The coordinator side of a sandbox cluster: Greenplum's catalog relations that the
-- toolkit reads, a gxid allocator, and the controller functions. Installed once, by
-- `gpcdc sandbox up`, in the schema gp_dist, which is on the database's search_path.
--
-- Advisory locks (two-key form; key 1 names the lock, key 2 the instance):
--   1196454761 ('GPsi'), 0      transaction-start lock: shared at every distributed-
--                               transaction start until it is marked running, exclusive
--                               by the controller (a peaceful bootstrap, an expansion)
--   1196454484 ('GPrT'), gxid   held for the life of a running distributed transaction
--   1196450636 ('GPcL'), 0      commit lock: shared across a commit phase (record to the
--                               last segment commit), exclusive for a consistent cut
--   a pipeline's key, gxid      on a target: held by a validator from before sync point
--                               gxid's cut; the replayer waits for it having applied it
--                               (key 1 from the pipeline's name: cluster.syncpoint_lock)

CREATE SCHEMA gp_dist;

CREATE TABLE gp_dist.gp_segment_configuration (
    dbid smallint PRIMARY KEY,
    content smallint NOT NULL,
    role "char" NOT NULL,
    preferred_role "char" NOT NULL,
    mode "char" NOT NULL,
    status "char" NOT NULL,
    port integer NOT NULL,
    hostname text NOT NULL,
    address text NOT NULL,
    datadir text NOT NULL
);

-- distkey holds attribute numbers, as Greenplum's does, so renames keep it right.
CREATE TABLE gp_dist.gp_distribution_policy (
    localoid oid PRIMARY KEY,
    distkey smallint[] NOT NULL
);

CREATE SEQUENCE gp_dist.gxid_seq;

-- The gxids whose commit record is written: what in-doubt resolution reads to finish a
-- prepared part whose client went away. Resolution prunes the rows it no longer needs.
CREATE TABLE gp_dist.committed_gxids (gxid bigint PRIMARY KEY);

-- Every distributed transaction starts here: pass the start lock, take a gxid, and
-- mark the transaction running until gp_dist.dtx_end. Also returns how many segments
-- the catalog lists, which rows are routed over. The start lock is held shared until
-- the transaction is marked running and the count read: a holder of it exclusive (a
-- peaceful bootstrap, an expansion) that then waits for running transactions sees this
-- one, or this one starts after it. An expansion changes the count only under that
-- lock with no transaction running, so the count holds for the whole transaction.
CREATE FUNCTION gp_dist.dtx_begin(OUT gxid bigint, OUT segments int) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock_shared(1196454761, 0);
    -- A consistent cut (commit lock exclusive) must never see a gxid that is taken
    -- but not yet marked running: the two steps happen under the commit lock.
    PERFORM pg_advisory_lock_shared(1196450636, 0);
    gxid := nextval('gp_dist.gxid_seq');
    IF gxid >= 2147483647 THEN  -- running gxids are advisory-lock keys, which are int4
        PERFORM pg_advisory_unlock_shared(1196450636, 0);  -- session locks outlive the error
        PERFORM pg_advisory_unlock_shared(1196454761, 0);
        RAISE EXCEPTION 'the sandbox has used up its gxids (% >= 2147483647)', gxid
            USING HINT = 'create a new sandbox';
    END IF;
    PERFORM pg_advisory_lock(1196454484, gxid::int);
    PERFORM pg_advisory_unlock_shared(1196450636, 0);
    SELECT count(*) INTO segments FROM gp_dist.gp_segment_configuration WHERE role = 'p' AND content >= 0;
    PERFORM pg_advisory_unlock_shared(1196454761, 0);
END $$;

-- Enter the commit phase: take the commit lock shared; for a two-phase commit also
-- write the distributed commit record (in this statement's own local transaction).
CREATE FUNCTION gp_dist.dtx_commit_phase(gxid bigint, segments int[], write_record boolean,
                                         legacy boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock_shared(1196450636, 0);
    IF write_record THEN
        INSERT INTO gp_dist.committed_gxids VALUES (gxid);
        PERFORM pg_logical_emit_message(true, 'gpcdc.commit',
            CASE WHEN legacy THEN json_build_object('gxid', gxid)::text
                 ELSE json_build_object('gxid', gxid, 'segments', to_json(segments))::text END);
    END IF;
END $$;

-- Leave the distributed transaction: release whatever of its locks it holds.
CREATE FUNCTION gp_dist.dtx_end(gxid bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
               AND classid = 1196450636 AND objsubid = 2) THEN
        PERFORM pg_advisory_unlock_shared(1196450636, 0);
    END IF;
    PERFORM pg_advisory_unlock(1196454484, gxid::int);
END $$;

CREATE FUNCTION gp_dist.running_gxids() RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
    SELECT objid::bigint FROM pg_locks
    WHERE locktype = 'advisory' AND classid = 1196454484 AND objsubid = 2 AND granted
$$;

CREATE FUNCTION gp_dist.gp_acquire_transaction_start_lock() RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_lock(1196454761, 0)
$$;

CREATE FUNCTION gp_dist.gp_release_transaction_start_lock() RETURNS boolean LANGUAGE sql AS $$
    SELECT pg_advisory_unlock(1196454761, 0)
$$;

-- Wait until no distributed transaction runs but except_gxid (0: none excepted).
CREATE FUNCTION gp_dist.gp_wait_running_transaction_end(except_gxid bigint DEFAULT 0,
                                                        timeout_seconds float8 DEFAULT 60)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => timeout_seconds);
    still_running bigint[];
BEGIN
    LOOP
        SELECT array_agg(g ORDER BY g) INTO still_running
        FROM gp_dist.running_gxids() AS g WHERE g <> except_gxid;
        EXIT WHEN still_running IS NULL;
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'distributed transactions still running after % s: gxids %',
                timeout_seconds, still_running;
        END IF;
        PERFORM pg_sleep(0.005);
    END LOOP;
END $$;

-- The first gxid not yet assigned (for a distributed snapshot's xmax).
CREATE FUNCTION gp_dist.next_gxid() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM gp_dist.gxid_seq
$$;

CREATE FUNCTION gp_dist.gp_acquire_commit_lock() RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_lock(1196450636, 0)
$$;

CREATE FUNCTION gp_dist.gp_release_commit_lock() RETURNS boolean LANGUAGE sql AS $$
    SELECT pg_advisory_unlock(1196450636, 0)
$$;

-- Record a new table's distribution key, refusing what Greenplum refuses.
CREATE FUNCTION gp_dist.set_distribution_policy(rel regclass, columns text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    missing text[];
    pkey text[];
BEGIN
    IF (SELECT xmin FROM pg_class WHERE oid = rel)::text::bigint
       <> pg_current_xact_id()::text::bigint % 4294967296 THEN  -- not created by this transaction
        RETURN;  -- CREATE TABLE IF NOT EXISTS of a table that exists: it keeps its key, as in Greenplum
    END IF;
    -- Left by a table dropped outside the toolkit, whose OID the new table reuses.
    DELETE FROM gp_dist.gp_distribution_policy WHERE localoid = rel;
    SELECT array_agg(c) INTO missing FROM unnest(columns) AS c
    WHERE NOT EXISTS (SELECT FROM pg_attribute
                      WHERE attrelid = rel AND attname = c AND attnum > 0 AND NOT attisdropped);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'DISTRIBUTED BY names column(s) % that % does not have',
            array_to_string(missing, ', '), rel USING HINT = 'name existing columns';
    END IF;
    SELECT array_agg(a.attname::text ORDER BY k.i) INTO pkey
    FROM pg_index x, unnest(x.indkey) WITH ORDINALITY AS k(attnum, i)
    JOIN pg_attribute a ON a.attrelid = rel AND a.attnum = k.attnum
    WHERE x.indrelid = rel AND x.indisprimary;
    IF pkey IS NOT NULL AND NOT columns <@ pkey THEN
        RAISE EXCEPTION 'the primary key (%) of % does not contain its distribution key (%)',
            array_to_string(pkey, ', '), rel, array_to_string(columns, ', ')
            USING HINT = 'include the distribution key in the primary key, as Greenplum requires';
    END IF;
    INSERT INTO gp_dist.gp_distribution_policy
    SELECT rel, array_agg(attnum ORDER BY array_position(columns, attname::text))
    FROM pg_attribute WHERE attrelid = rel AND attname = ANY(columns);
END $$;
