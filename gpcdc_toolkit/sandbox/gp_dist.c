/*
 * The sandbox's functions in C, in schema gp_dist on every node, for what a query must
 * compute row by row inside the servers (Greenplum routes in C inside its servers too).
 *
 * gp_dist.segment_of(segments int, VARIADIC key text[]) RETURNS int
 *   Where a row belongs: what gpcdc_toolkit.cluster.segment_for computes in Python.
 *   key text: the values' text, joined by 0x1f, a NULL as the byte 0x00;
 *   hash:     the key text's CRC-32 (zlib's: polynomial 0xEDB88320, reflected, initial
 *             and final value 0xFFFFFFFF), cheap in both forms (PostgreSQL's md5()
 *             costs ten times the scan of a row);
 *   segment:  Lamping and Veach's jump consistent hash of it over the segments.
 *
 * gp_dist.row_hash(VARIADIC "any") RETURNS bigint  (C symbol gpcdc_row_hash_3)
 *   A row's 64-bit hash for checksum validation, its columns given in order. Each value
 *   is hashed by the bytes it is stored as where the type's stored form is its value
 *   (equal bytes print alike, so equal hashes never hide a difference the text would
 *   show), else by its output text: five times cheaper than hashing the text of every
 *   column. The row is one stream of 64-bit words, each column a word saying whether
 *   it is NULL or how long it is, then its bytes: two rows of the same types make the
 *   same stream only when their values are alike. The words are folded in by
 *   xxHash64's round and the row ends with MurmurHash3's finalizer, so the sum of
 *   rows' hashes is not linear in their values (values swapped between rows change
 *   it). Like every 64-bit hash here, it guards against chance, not against values
 *   crafted to collide. Folding words costs two thirds of hashing each column apart
 *   with hash_bytes_extended, which sets up and finalizes for each. The symbol names
 *   the form: a server whose library hashes otherwise (an older sandbox) is not asked
 *   for this one.
 *
 * gp_dist.chunk_digests(hash bigint, key bigint) RETURNS bytea, an aggregate of rows
 *   Each chunk's digest at validation's first level in one pass: the rows whose hash
 *   has the same top 16 bits are a chunk; its digest is their count, the sum of their
 *   hashes modulo 2**64 and the XOR of their keys (a table's one integer key column,
 *   else 0). Where one side's chunk holds exactly one row more than the other's, the
 *   XOR of both sides' keys is that row's key, if the chunk differs by that row alone:
 *   validation looks the row up by its key rather than reading the table again, and
 *   proves the guess by the row's hash. A flat array of the 65,536 chunks rather than
 *   GROUP BY's hash table: 10-30% more than one sum over the table, where grouping
 *   costs three times it. Returned for the chunks that hold rows, in prefix order, each
 *   as 26 bytes in network order: prefix (uint16), rows (int64), sum (uint64), keys
 *   (uint64). Parallel-safe: partial states are added.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "port/pg_bswap.h"
#include "utils/array.h"
#include "utils/lsyscache.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(gpcdc_segment_of);
PG_FUNCTION_INFO_V1(gpcdc_row_hash_3);
PG_FUNCTION_INFO_V1(gpcdc_chunks_add);
PG_FUNCTION_INFO_V1(gpcdc_chunks_combine);
PG_FUNCTION_INFO_V1(gpcdc_chunks_serialize);
PG_FUNCTION_INFO_V1(gpcdc_chunks_deserialize);
PG_FUNCTION_INFO_V1(gpcdc_chunks_final);

static uint32 crc_table[256];

void		_PG_init(void);

void
_PG_init(void)
{
	for (uint32 n = 0; n < 256; n++)
	{
		uint32		c = n;

		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xEDB88320 ^ (c >> 1) : c >> 1;
		crc_table[n] = c;
	}
}

static uint32
crc32(const char *data, int length)
{
	uint32		crc = 0xFFFFFFFF;

	for (int i = 0; i < length; i++)
		crc = crc_table[(crc ^ (uint8) data[i]) & 0xFF] ^ (crc >> 8);
	return crc ^ 0xFFFFFFFF;
}

static int32
jump_consistent_hash(uint64 key, int32 buckets)
{
	int64		b = -1;
	int64		j = 0;

	while (j < buckets)
	{
		b = j;
		key = key * UINT64CONST(2862933555777941757) + 1;
		/* In doubles, as the Python form computes it, so that both agree bit for bit. */
		j = (int64) ((double) (b + 1) * ((double) (INT64CONST(1) << 31) / (double) ((key >> 33) + 1)));
	}
	return (int32) b;
}

Datum
gpcdc_segment_of(PG_FUNCTION_ARGS)
{
	int32		segments = PG_GETARG_INT32(0);
	ArrayType  *key = PG_GETARG_ARRAYTYPE_P(1);
	Datum	   *values;
	bool	   *nulls;
	int			count;
	StringInfoData text;
	uint32		hash;

	if (segments < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a cluster needs at least 1 segment, got %d", segments)));
	if (ARR_NDIM(key) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("a distribution key is a list of values, not an array of %d dimensions", ARR_NDIM(key))));

	deconstruct_array(key, TEXTOID, -1, false, TYPALIGN_INT, &values, &nulls, &count);
	initStringInfo(&text);
	for (int i = 0; i < count; i++)
	{
		if (i > 0)
			appendStringInfoChar(&text, '\x1f');
		if (nulls[i])
			appendStringInfoChar(&text, '\0');
		else
			appendBinaryStringInfo(&text, VARDATA_ANY(DatumGetPointer(values[i])),
								   VARSIZE_ANY_EXHDR(DatumGetPointer(values[i])));
	}
	hash = crc32(text.data, text.len);

	pfree(text.data);
	pfree(values);
	pfree(nulls);
	PG_RETURN_INT32(jump_consistent_hash(hash, segments));
}

/*
 * Types whose stored bytes are their value: the same value is stored alike on every
 * server of this version and architecture, and the bytes determine the output text.
 * Others (enums and composites hold OIDs of their own cluster, intervals, json...)
 * are hashed by their text. A value stored differently on the two sides would only
 * make its chunk differ, and the rows' text comparison that follows is exact.
 */
static bool
stored_form_is_value(Oid type)
{
	switch (type)
	{
		case BOOLOID:
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case FLOAT4OID:
		case FLOAT8OID:
		case NUMERICOID:
		case TEXTOID:
		case VARCHAROID:
		case BPCHAROID:
		case BYTEAOID:
		case DATEOID:
		case TIMEOID:
		case TIMESTAMPOID:
		case TIMESTAMPTZOID:
		case UUIDOID:
		case JSONBOID:
			return true;
		default:
			return false;
	}
}

typedef struct Column
{
	int16		typlen;
	bool		byval;
	bool		as_text;
	FmgrInfo	output;
} Column;

typedef struct Columns
{
	int			count;
	Column		columns[FLEXIBLE_ARRAY_MEMBER];
} Columns;

static Columns *
columns_of_call(FunctionCallInfo fcinfo)
{
	Columns    *out;

	if (get_fn_expr_variadic(fcinfo->flinfo))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("gp_dist.row_hash takes a row's columns as its arguments, not an array after VARIADIC")));
	out = MemoryContextAlloc(fcinfo->flinfo->fn_mcxt, offsetof(Columns, columns) + sizeof(Column) * PG_NARGS());
	out->count = PG_NARGS();
	for (int i = 0; i < PG_NARGS(); i++)
	{
		Column	   *column = &out->columns[i];
		Oid			type = get_fn_expr_argtype(fcinfo->flinfo, i);
		Oid			base;
		Oid			element;

		if (!OidIsValid(type))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("gp_dist.row_hash cannot tell the type of its argument %d", i + 1)));
		base = getBaseType(type);
		element = get_element_type(base);	/* an array's header names it: a built-in one only */
		get_typlenbyval(base, &column->typlen, &column->byval);
		column->as_text = !(stored_form_is_value(base) || (OidIsValid(element) && stored_form_is_value(element)));
		if (column->as_text)
		{
			Oid			function;
			bool		varlena;

			getTypeOutputInfo(type, &function, &varlena);
			fmgr_info_cxt(function, &column->output, fcinfo->flinfo->fn_mcxt);
		}
	}
	return out;
}

/*
 * xxHash64's round: the word is added to the state before the rotation and the
 * multiplication, so what a word does depends, through the carries, on the state it
 * meets. (MurmurHash3's body mixes the word alone and then XORs it in: two words can
 * then be chosen to cancel each other's difference from any state, whatever the row's
 * other values. Here such a pair works from about half the states: harder to craft,
 * not impossible, as with any hash that is not cryptographic.)
 */
static inline uint64
fold(uint64 state, uint64 word)
{
	state += word * UINT64CONST(0xC2B2AE3D27D4EB4F);
	state = (state << 31) | (state >> 33);
	return state * UINT64CONST(0x9E3779B185EBCA87);
}

/* MurmurHash3's finalizer: every bit of the state reaches every bit of the hash. */
static inline uint64
finalize(uint64 state)
{
	state ^= state >> 33;
	state *= UINT64CONST(0xFF51AFD7ED558CCD);
	state ^= state >> 33;
	state *= UINT64CONST(0xC4CEB9FE1A85EC53);
	return state ^ (state >> 33);
}

#define NULL_WORD UINT64CONST(0)	/* a value's first word is its length + 1 */

static uint64
fold_bytes(uint64 state, const char *bytes, Size length)
{
	uint64		word;

	state = fold(state, (uint64) length + 1);
	for (; length >= sizeof(word); bytes += sizeof(word), length -= sizeof(word))
	{
		memcpy(&word, bytes, sizeof(word));
		state = fold(state, word);
	}
	if (length > 0)
	{
		/* Byte by byte: a copy of a length known only now would call memcpy. */
		word = 0;
		for (Size i = 0; i < length; i++)
			word |= (uint64) (unsigned char) bytes[i] << (8 * i);
		state = fold(state, word);
	}
	return state;
}

Datum
gpcdc_row_hash_3(PG_FUNCTION_ARGS)
{
	Columns    *columns = (Columns *) fcinfo->flinfo->fn_extra;
	uint64		state = UINT64CONST(0x9E3779B97F4A7C15);

	if (columns == NULL)
		fcinfo->flinfo->fn_extra = columns = columns_of_call(fcinfo);
	for (int i = 0; i < columns->count; i++)
	{
		Column	   *column = &columns->columns[i];
		Datum		value = PG_GETARG_DATUM(i);

		if (PG_ARGISNULL(i))
			state = fold(state, NULL_WORD);
		else if (column->as_text)
		{
			char	   *text = OutputFunctionCall(&column->output, value);

			state = fold_bytes(state, text, strlen(text));
			pfree(text);
		}
		else if (column->byval)
		{
			int64		bits;	/* the value's own bits, whatever the rest of the Datum holds */

			switch (column->typlen)
			{
				case 1:
					bits = DatumGetChar(value);
					break;
				case 2:
					bits = DatumGetInt16(value);
					break;
				case 4:
					bits = DatumGetInt32(value);
					break;
				default:
					bits = DatumGetInt64(value);
			}
			state = fold(fold(state, sizeof(bits) + 1), (uint64) bits);
		}
		else if (column->typlen > 0)
			state = fold_bytes(state, DatumGetPointer(value), column->typlen);
		else
		{
			/* Whether compressed, out of line or with a short header, the same bytes. */
			struct varlena *stored = (struct varlena *) DatumGetPointer(value);
			struct varlena *plain = pg_detoast_datum_packed(stored);

			state = fold_bytes(state, VARDATA_ANY(plain), VARSIZE_ANY_EXHDR(plain));
			if (plain != stored)
				pfree(plain);
		}
	}
	PG_RETURN_INT64((int64) finalize(state));
}

#define CHUNK_BITS 16
#define CHUNKS (1 << CHUNK_BITS)
#define DIGEST_BYTES (2 + 8 + 8 + 8)

/* A chunk's count, sum and keys side by side: a row touches one or two cache lines. */
typedef struct ChunkDigest
{
	int64		rows;
	uint64		sum;
	uint64		keys;
} ChunkDigest;

typedef struct Chunks
{
	ChunkDigest chunks[CHUNKS];
} Chunks;

/* A state in the aggregate's own memory, which lives as long as the aggregate does. */
static Chunks *
chunks_new(FunctionCallInfo fcinfo)
{
	MemoryContext aggregate;

	if (!AggCheckCallContext(fcinfo, &aggregate))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gp_dist.chunk_digests is an aggregate: call it over rows")));
	return (Chunks *) MemoryContextAllocZero(aggregate, sizeof(Chunks));
}

Datum
gpcdc_chunks_add(PG_FUNCTION_ARGS)
{
	Chunks	   *state = PG_ARGISNULL(0) ? chunks_new(fcinfo) : (Chunks *) PG_GETARG_POINTER(0);
	uint64		hash;
	ChunkDigest *chunk;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("gp_dist.chunk_digests was given a NULL row hash: a row hash is never NULL")));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("gp_dist.chunk_digests was given a NULL key: give the key column, or 0 for a table without one")));
	hash = (uint64) PG_GETARG_INT64(1);
	chunk = &state->chunks[hash >> (64 - CHUNK_BITS)];
	chunk->rows++;
	chunk->sum += hash;
	chunk->keys ^= (uint64) PG_GETARG_INT64(2);
	PG_RETURN_POINTER(state);
}

Datum
gpcdc_chunks_combine(PG_FUNCTION_ARGS)
{
	Chunks	   *into;
	Chunks	   *from;

	if (PG_ARGISNULL(1))
	{
		if (PG_ARGISNULL(0))
			PG_RETURN_NULL();
		PG_RETURN_POINTER(PG_GETARG_POINTER(0));
	}
	/* The second state may live elsewhere: added into one of the aggregate's own. */
	into = PG_ARGISNULL(0) ? chunks_new(fcinfo) : (Chunks *) PG_GETARG_POINTER(0);
	from = (Chunks *) PG_GETARG_POINTER(1);
	for (int i = 0; i < CHUNKS; i++)
	{
		into->chunks[i].rows += from->chunks[i].rows;
		into->chunks[i].sum += from->chunks[i].sum;
		into->chunks[i].keys ^= from->chunks[i].keys;
	}
	PG_RETURN_POINTER(into);
}

/* Between the processes of one server: its own byte order. */
Datum
gpcdc_chunks_serialize(PG_FUNCTION_ARGS)
{
	Chunks	   *state = (Chunks *) PG_GETARG_POINTER(0);
	bytea	   *out = (bytea *) palloc(VARHDRSZ + sizeof(Chunks));

	SET_VARSIZE(out, VARHDRSZ + sizeof(Chunks));
	memcpy(VARDATA(out), state, sizeof(Chunks));
	PG_RETURN_BYTEA_P(out);
}

Datum
gpcdc_chunks_deserialize(PG_FUNCTION_ARGS)
{
	bytea	   *in = PG_GETARG_BYTEA_PP(0);
	Chunks	   *state;

	if (!AggCheckCallContext(fcinfo, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gp_dist.chunk_digests is an aggregate: call it over rows")));
	if (VARSIZE_ANY_EXHDR(in) != sizeof(Chunks))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
				 errmsg("a partial gp_dist.chunk_digests state holds %zu bytes, not %zu",
						(size_t) VARSIZE_ANY_EXHDR(in), sizeof(Chunks))));
	state = (Chunks *) palloc(sizeof(Chunks));
	memcpy(state, VARDATA_ANY(in), sizeof(Chunks));
	PG_RETURN_POINTER(state);
}

Datum
gpcdc_chunks_final(PG_FUNCTION_ARGS)
{
	Chunks	   *state;
	int			held = 0;
	bytea	   *out;
	char	   *at;

	if (PG_ARGISNULL(0))		/* no rows: no chunk holds any */
	{
		out = (bytea *) palloc(VARHDRSZ);
		SET_VARSIZE(out, VARHDRSZ);
		PG_RETURN_BYTEA_P(out);
	}
	state = (Chunks *) PG_GETARG_POINTER(0);
	for (int i = 0; i < CHUNKS; i++)
		held += state->chunks[i].rows != 0;
	out = (bytea *) palloc(VARHDRSZ + (Size) held * DIGEST_BYTES);
	SET_VARSIZE(out, VARHDRSZ + (Size) held * DIGEST_BYTES);
	at = VARDATA(out);
	for (int i = 0; i < CHUNKS; i++)
	{
		uint16		prefix;
		uint64		rows;
		uint64		sum;
		uint64		keys;

		if (state->chunks[i].rows == 0)
			continue;
		prefix = pg_hton16((uint16) i);
		rows = pg_hton64((uint64) state->chunks[i].rows);
		sum = pg_hton64(state->chunks[i].sum);
		keys = pg_hton64(state->chunks[i].keys);
		memcpy(at, &prefix, 2);
		memcpy(at + 2, &rows, 8);
		memcpy(at + 10, &sum, 8);
		memcpy(at + 18, &keys, 8);
		at += DIGEST_BYTES;
	}
	PG_RETURN_BYTEA_P(out);
}
