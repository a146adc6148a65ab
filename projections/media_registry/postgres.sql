-- media_registry, version 4 (PostgreSQL).
-- The t: placeholder is replaced by the table's name where it is defined and
-- the r: placeholder where it is referenced, so the same text creates the live
-- tables, a shadow copy, or a scratch copy in another schema. Ids are uuid,
-- times timestamptz (exact to the microsecond); the CHECKs are SQLite's.
CREATE TABLE {{t:media}} (
    id             uuid        PRIMARY KEY,
    -- Bytewise, as SQLite compares: a range of paths (a prefix) holds the
    -- same items on both backends, whatever the database's collation.
    path           text        COLLATE "C" NOT NULL,
    media_kind     text        NOT NULL,
    content_digest text,
    byte_size      bigint      CHECK (byte_size IS NULL OR byte_size >= 0),
    registered_at  timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    version        bigint      NOT NULL CHECK (version >= 1)
);

-- Items by path, and of one media kind by path (version 4): lookups by
-- path and `media list`, walked in (path, id) order from a keyset position,
-- a path prefix as a range of paths.
CREATE INDEX {{t:media}}_by_path ON {{r:media}} (path, id);
CREATE INDEX {{t:media}}_by_kind ON {{r:media}} (media_kind, path, id);

CREATE TABLE {{t:media_regions}} (
    id              uuid        PRIMARY KEY,
    media_id        uuid        NOT NULL REFERENCES {{r:media}} (id) ON DELETE CASCADE,
    x               bigint      NOT NULL CHECK (x >= 0),
    y               bigint      NOT NULL CHECK (y >= 0),
    width           bigint      NOT NULL CHECK (width >= 0),
    height          bigint      NOT NULL CHECK (height >= 0),
    region_revision bigint      NOT NULL,
    created_at      timestamptz NOT NULL
);

-- Also what makes the cascade from a media item cheap.
CREATE INDEX {{t:media_regions}}_by_media ON {{r:media_regions}} (media_id);

-- Running counts of registered media items and their regions (a removed
-- item's regions are subtracted as they cascade away), kept by the same fold as the rows they count,
-- so the dashboard reads a row instead of counting a table (version 3).
CREATE TABLE {{t:media_counts}} (
    name   text PRIMARY KEY,
    counts text NOT NULL
);
