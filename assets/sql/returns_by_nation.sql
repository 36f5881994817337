-- Revenue lost to returned items in 1993-Q4 per nation: TPC-H Q10's customers summed up, a
-- derived table that reads another derived table (tpch_q10).
select
    n_name,
    count(*) as customers,
    sum(revenue) as revenue
from tpch_q10
group by n_name
