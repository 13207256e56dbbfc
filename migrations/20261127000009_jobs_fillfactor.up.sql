-- Room on each page of `jobs` for a row's next version. Most updates of a job change no
-- indexed column (its recorded reason, position and expected start, when it was
-- dispatched), and PostgreSQL writes those as heap-only tuples, touching none of the
-- table's indexes, but only when the new version fits on the same page. Packed full (the
-- default), nearly every update had to write every index. Pages written before this
-- change keep their packing until they are rewritten.
alter table jobs set (fillfactor = 70);
