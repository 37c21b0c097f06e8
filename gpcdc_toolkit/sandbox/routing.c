/*
 * The sandbox's routing of rows to segments, as a function of its servers, so that a
 * query can ask where each row belongs (Greenplum routes in C inside its servers too).
 * It computes what gpcdc_toolkit.cluster.segment_for computes in Python:
 *
 *   key text: the values' text, joined by 0x1f, a NULL as the byte 0x00;
 *   hash:     the key text's CRC-32 (zlib's: polynomial 0xEDB88320, reflected, initial
 *             and final value 0xFFFFFFFF), cheap in both forms (PostgreSQL's md5()
 *             costs ten times the scan of a row);
 *   segment:  Lamping and Veach's jump consistent hash of it over the segments.
 *
 *   gp_dist.segment_of(segments int, VARIADIC key text[]) RETURNS int
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/array.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(gpcdc_segment_of);

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
