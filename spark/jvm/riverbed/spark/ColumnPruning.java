package riverbed.spark;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.AttributeSet;
import org.apache.spark.sql.catalyst.plans.logical.Filter;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2ScanRelation;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.internal.connector.SupportsMetadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Column pruning for one Python data source (Riverbed's), which Spark 4.3 does not do itself.
 *
 * <p>Spark's scan builder for Python data sources has no {@code SupportsPushDownRequiredColumns},
 * so {@code V2ScanRelationPushDown} leaves the scan reading every column of the source's schema
 * and puts a {@code Project} (and any {@code Filter}s) on top of it:
 * {@code Project(list, Filter*(DataSourceV2ScanRelation(PythonScan)))}. This rule runs later (in
 * the optimizer's "User Provided Optimizers" batch, where {@code experimental().extraOptimizations}
 * go) and swaps that scan for one whose read schema holds only the columns the Project and the
 * Filters reference. The Python reader is then created with that schema, so it reads only those
 * columns.
 *
 * <p>What it leaves alone: any other source; a scan not directly under a Project (its parent may
 * need every column); a scan with filters pushed into Python (the new scan would not carry them).
 * The kept attributes are the scan's own objects, so their exprIds, and the Project's output,
 * are unchanged. If Spark's internals differ from what this was built against, the rule logs
 * once and leaves plans as they are: fewer columns is an optimization, never a requirement.
 */
public final class ColumnPruning extends Rule<LogicalPlan> {
  static final String PYTHON_SCAN = "org.apache.spark.sql.execution.datasources.v2.python.PythonScan";
  static final String PYTHON_TABLE =
      "org.apache.spark.sql.execution.datasources.v2.python.PythonTable";
  // When a query needs no column (count()), a reader still has to yield rows: it reads this one,
  // the cheapest (one value per object, so one dictionary entry and a run-length).
  static final String CHEAPEST_COLUMN = "partition";

  private final String sourceName;
  private volatile boolean warned = false;

  public ColumnPruning(String sourceName) {
    this.sourceName = sourceName;
  }

  public String sourceName() {
    return sourceName;
  }

  @Override
  public String ruleName() {
    return "riverbed.spark.ColumnPruning(" + sourceName + ")";
  }

  @Override
  public LogicalPlan apply(LogicalPlan plan) {
    if (plan instanceof Project project) {
      LogicalPlan pruned = prunedOrNull(project);
      if (pruned != null) {
        return pruned;
      }
    }
    return plan.mapChildren(this::apply);
  }

  /** The Project with its scan narrowed, or null when there is nothing (safe) to narrow. */
  private LogicalPlan prunedOrNull(Project project) {
    List<Filter> filters = new ArrayList<>();
    LogicalPlan node = project.child();
    while (node instanceof Filter filter) {
      filters.add(filter);
      node = filter.child();
    }
    if (!(node instanceof DataSourceV2ScanRelation relation) || !isOurs(relation)) {
      return null;
    }
    try {
      AttributeSet required = project.references();
      for (Filter filter : filters) {
        required = required.$plus$plus(filter.references());
      }
      DataSourceV2ScanRelation narrowed = narrowed(relation, required);
      if (narrowed == null) {
        return null;
      }
      LogicalPlan child = narrowed;
      for (int i = filters.size() - 1; i >= 0; i--) {
        child = filters.get(i).withNewChildren(seq(List.of(child)));
      }
      return project.withNewChildren(seq(List.of(child)));
    } catch (RuntimeException | LinkageError error) {
      if (!warned) {
        warned = true;
        log().warn(ruleName() + " is off: this Spark's internals are not those it was built"
            + " for; queries read every column", error);
      }
      return null;
    }
  }

  private boolean isOurs(DataSourceV2ScanRelation relation) {
    Table table = relation.relation().table();
    return relation.scan().getClass().getName().equals(PYTHON_SCAN)
        && table.getClass().getName().equals(PYTHON_TABLE)
        && sourceName.equals(table.name());
  }

  /** The scan relation reading only `required` (at least one column), or null if it already does. */
  private DataSourceV2ScanRelation narrowed(DataSourceV2ScanRelation relation, AttributeSet required) {
    Scan scan = relation.scan();
    if (!noFiltersPushed(scan)) {
      return null;
    }
    List<AttributeReference> output = CollectionConverters.asJava(relation.output());
    StructField[] fields = scan.readSchema().fields();
    if (fields.length != output.size()) {
      return null; // not the shape V2ScanRelationPushDown gives: leave it
    }
    List<AttributeReference> kept = new ArrayList<>();
    List<StructField> keptFields = new ArrayList<>();
    for (int i = 0; i < fields.length; i++) {
      if (!fields[i].name().equals(output.get(i).name())) {
        return null;
      }
      if (required.contains(output.get(i))) {
        kept.add(output.get(i));
        keptFields.add(fields[i]);
      }
    }
    if (kept.isEmpty()) {
      int cheapest = Math.max(0, indexOf(fields, CHEAPEST_COLUMN));
      kept.add(output.get(cheapest));
      keptFields.add(fields[cheapest]);
    }
    if (kept.size() == output.size()) {
      return null;
    }
    StructType schema = new StructType(keptFields.toArray(new StructField[0]));
    Scan newScan = scanOf(relation.relation().options(), schema);
    if (!newScan.readSchema().equals(schema)) {
      return null;
    }
    return withScan(relation, newScan, kept);
  }

  /**
   * A scan of the source with `schema`, through the Data Source V2 API as a DataFrameReader
   * builds one, from a provider of its own: the provider caches the Python reader it plans (for
   * the schema it is first asked for) and is shared by every query on the same DataFrame.
   */
  private Scan scanOf(CaseInsensitiveStringMap options, StructType schema) {
    PythonDataSourceV2 provider = new PythonDataSourceV2();
    provider.setShortName(sourceName);
    Table table = provider.getTable(schema, new Transform[0], options);
    return ((SupportsRead) table).newScanBuilder(options).build();
  }

  /** Filters the Python reader accepted would be lost by a new scan: only prune without them. */
  private static boolean noFiltersPushed(Scan scan) {
    if (!(scan instanceof SupportsMetadata metadata)) {
      return false;
    }
    scala.Option<String> pushed = metadata.getMetaData().get("PushedFilters");
    return pushed.isDefined() && pushed.get().equals("[]");
  }

  /** A copy of `relation` with another scan and output; its other fields as they were. */
  private static DataSourceV2ScanRelation withScan(
      DataSourceV2ScanRelation relation, Scan scan, List<AttributeReference> output) {
    Object oldScan = relation.scan();
    Object oldOutput = relation.output();
    List<Object> args = new ArrayList<>();
    Set<String> replaced = new HashSet<>();
    scala.collection.Iterator<Object> fields = relation.productIterator();
    while (fields.hasNext()) {
      Object field = fields.next();
      if (field == oldScan) {
        args.add(scan);
        replaced.add("scan");
      } else if (field == oldOutput) {
        args.add(seq(output));
        replaced.add("output");
      } else {
        args.add(field);
      }
    }
    if (replaced.size() != 2) {
      throw new IllegalStateException("DataSourceV2ScanRelation has no scan or output field");
    }
    return (DataSourceV2ScanRelation) relation.makeCopy(args.toArray());
  }

  private static int indexOf(StructField[] fields, String name) {
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  private static <T> scala.collection.immutable.Seq<T> seq(List<T> items) {
    return CollectionConverters.asScala(items).toSeq();
  }
}
