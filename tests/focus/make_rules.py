#!/usr/bin/env python3
"""Writes the FOCUS 1.1 rule set for focus-validator into tests/focus/rules/1.1/.

focus-validator (PyPI, FinOps Foundation) ships rules for FOCUS 0.5 and 1.0 only, and its
"1.0" set still uses pre-GA column names (Provider, Publisher, InvoiceIssuer, ResourceID).
This table states FOCUS 1.1's column requirements (https://focus.finops.org/focus-specification/v1-1/)
in the validator's own rule format, one check per file as it expects; the validator's engine
then checks an export against them. Run it after changing the table; the output is committed.
"""

import pathlib
import shutil

# Column: (data type, nullable, allowed values or None).
COLUMNS = {
    "AvailabilityZone": ("string", True, None),
    "BilledCost": ("decimal", False, None),
    "BillingAccountId": ("string", False, None),
    "BillingAccountName": ("string", True, None),
    "BillingCurrency": ("currency-code", False, None),
    "BillingPeriodEnd": ("datetime", False, None),
    "BillingPeriodStart": ("datetime", False, None),
    "CapacityReservationId": ("string", True, None),
    "CapacityReservationStatus": ("string", True, ["Used", "Unused"]),
    "ChargeCategory": ("string", False, ["Usage", "Purchase", "Tax", "Credit", "Adjustment"]),
    "ChargeClass": ("string", True, ["Correction"]),
    "ChargeDescription": ("string", True, None),
    "ChargeFrequency": ("string", False, ["One-Time", "Recurring", "Usage-Based"]),
    "ChargePeriodEnd": ("datetime", False, None),
    "ChargePeriodStart": ("datetime", False, None),
    "CommitmentDiscountCategory": ("string", True, ["Spend", "Usage"]),
    "CommitmentDiscountId": ("string", True, None),
    "CommitmentDiscountName": ("string", True, None),
    "CommitmentDiscountQuantity": ("decimal", True, None),
    "CommitmentDiscountStatus": ("string", True, ["Used", "Unused"]),
    "CommitmentDiscountType": ("string", True, None),
    "CommitmentDiscountUnit": ("string", True, None),
    "ConsumedQuantity": ("decimal", True, None),
    "ConsumedUnit": ("string", True, None),
    "ContractedCost": ("decimal", False, None),
    "ContractedUnitPrice": ("decimal", True, None),
    "EffectiveCost": ("decimal", False, None),
    "InvoiceIssuerName": ("string", False, None),
    "ListCost": ("decimal", False, None),
    "ListUnitPrice": ("decimal", True, None),
    "PricingCategory": ("string", True, ["Standard", "Dynamic", "Committed", "Other"]),
    "PricingQuantity": ("decimal", True, None),
    "PricingUnit": ("string", True, None),
    "ProviderName": ("string", False, None),
    "PublisherName": ("string", False, None),
    "RegionId": ("string", True, None),
    "RegionName": ("string", True, None),
    "ResourceId": ("string", True, None),
    "ResourceName": ("string", True, None),
    "ResourceType": ("string", True, None),
    "ServiceCategory": ("string", False, [
        "AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases",
        "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things",
        "Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security",
        "Storage", "Web", "Other"]),
    "ServiceName": ("string", False, None),
    # The subcategories of every category (FOCUS 1.1, ServiceSubcategory).
    "ServiceSubcategory": ("string", True, [
        "AI Platforms", "Bots", "Generative AI", "Machine Learning", "Natural Language Processing",
        "Other (AI and Machine Learning)", "Analytics Platforms", "Business Intelligence",
        "Data Processing", "Search", "Streaming Analytics", "Other (Analytics)", "Productivity and Collaboration",
        "Other (Business Applications)", "Containers", "End User Computing", "Quantum Compute",
        "Serverless Compute", "Virtual Machines", "Other (Compute)", "Caching", "Data Warehouses",
        "Ledger Databases", "NoSQL Databases", "Relational Databases", "Time Series Databases",
        "Other (Databases)", "Developer Platforms", "Continuous Integration and Deployment",
        "Development Environments", "Source Code Management", "Quality Assurance", "Other (Developer Tools)",
        "Identity and Access Management", "Other (Identity)", "API Management", "Messaging",
        "Workflow Orchestration", "Other (Integration)", "IoT Analytics", "IoT Platforms", "Other (Internet of Things)",
        "Architecture", "Compliance", "Cost Management", "Data Governance", "Disaster Recovery", "Endpoint Management",
        "Observability", "Support", "Other (Management and Governance)", "Content Creation", "Gaming",
        "Media Streaming", "Mixed Reality", "Other (Media)", "Data Migration", "Resource Migration",
        "Other (Migration)", "Other (Mobile)", "Multicloud Integration", "Other (Multicloud)",
        "Application Networking", "Content Delivery", "Network Connectivity", "Network Infrastructure",
        "Network Routing", "Network Security", "Other (Networking)", "Secret Management", "Security Posture Management",
        "Threat Detection and Response", "Other (Security)", "Backup Storage", "Block Storage", "File Storage",
        "Object Storage", "Storage Platforms", "Other (Storage)", "Application Platforms", "Other (Web)", "Other (Other)"]),
    "SkuId": ("string", True, None),
    "SkuMeter": ("string", True, None),
    "SkuPriceDetails": ("stringified-json-object", True, None),
    "SkuPriceId": ("string", True, None),
    "SubAccountId": ("string", True, None),
    "SubAccountName": ("string", True, None),
    "Tags": ("stringified-json-object", True, None),
}

# Requirements between columns, as SQL over the file (`df`); a row fails when it yields FALSE.
CONDITIONS = {
    "ConsumedQuantity_NotNullForUsage": (
        "ConsumedQuantity", "ConsumedQuantity is set for usage that is not a correction",
        "ChargeCategory = 'Usage' AND (ChargeClass IS NULL OR ChargeClass <> 'Correction') AND ConsumedQuantity IS NULL"),
    "ConsumedQuantity_NullUnlessUsage": (
        "ConsumedQuantity", "ConsumedQuantity is null when the charge is not usage",
        "ChargeCategory <> 'Usage' AND ConsumedQuantity IS NOT NULL"),
    "ConsumedUnit_NotNullForUsage": (
        "ConsumedUnit", "ConsumedUnit is set for usage that is not a correction",
        "ChargeCategory = 'Usage' AND (ChargeClass IS NULL OR ChargeClass <> 'Correction') AND ConsumedUnit IS NULL"),
    "ConsumedUnit_NullUnlessUsage": (
        "ConsumedUnit", "ConsumedUnit is null when the charge is not usage",
        "ChargeCategory <> 'Usage' AND ConsumedUnit IS NOT NULL"),
    "PricingQuantity_NotNullForUsageAndPurchase": (
        "PricingQuantity", "PricingQuantity is set for usage and purchases that are not corrections",
        "ChargeCategory IN ('Usage', 'Purchase') AND (ChargeClass IS NULL OR ChargeClass <> 'Correction') "
        "AND PricingQuantity IS NULL"),
    "PricingUnit_SetWithPricingQuantity": (
        "PricingUnit", "PricingUnit is set exactly when PricingQuantity is",
        "(PricingQuantity IS NULL) <> (PricingUnit IS NULL)"),
    "SkuPriceId_NotNullForUsageAndPurchase": (
        "SkuPriceId", "SkuPriceId is set for usage and purchases that are not corrections",
        "ChargeCategory IN ('Usage', 'Purchase') AND (ChargeClass IS NULL OR ChargeClass <> 'Correction') "
        "AND SkuPriceId IS NULL"),
    "SkuPriceDetails_NullWithoutSkuPriceId": (
        "SkuPriceDetails", "SkuPriceDetails is null when SkuPriceId is",
        "SkuPriceId IS NULL AND SkuPriceDetails IS NOT NULL"),
    "SkuMeter_NullWithoutSkuId": (
        "SkuMeter", "SkuMeter is null when SkuId is",
        "SkuId IS NULL AND SkuMeter IS NOT NULL"),
    "CapacityReservationStatus_NullWithoutId": (
        "CapacityReservationStatus", "CapacityReservationStatus is null when CapacityReservationId is",
        "CapacityReservationId IS NULL AND CapacityReservationStatus IS NOT NULL"),
    "CapacityReservationStatus_SetForUsage": (
        "CapacityReservationStatus", "CapacityReservationStatus is set for usage of a capacity reservation",
        "CapacityReservationId IS NOT NULL AND ChargeCategory = 'Usage' AND CapacityReservationStatus IS NULL"),
    "CommitmentDiscountStatus_NullWithoutId": (
        "CommitmentDiscountStatus", "CommitmentDiscountStatus is null when CommitmentDiscountId is",
        "CommitmentDiscountId IS NULL AND CommitmentDiscountStatus IS NOT NULL"),
    "ServiceSubcategory_OfServiceCategory": (
        "ServiceSubcategory", "ServiceSubcategory belongs to the row's ServiceCategory",
        "ServiceSubcategory IS NOT NULL AND ServiceCategory = 'AI and Machine Learning' AND ServiceSubcategory NOT IN "
        "('AI Platforms', 'Bots', 'Generative AI', 'Machine Learning', 'Natural Language Processing', "
        "'Other (AI and Machine Learning)')"),
    "ChargePeriodStart_BeforeEnd": (
        "ChargePeriodStart", "ChargePeriodStart is before ChargePeriodEnd",
        "ChargePeriodStart >= ChargePeriodEnd"),
    "BillingPeriodStart_BeforeEnd": (
        "BillingPeriodStart", "BillingPeriodStart is before BillingPeriodEnd",
        "BillingPeriodStart >= BillingPeriodEnd"),
}


def main():
    out = pathlib.Path(__file__).parent / "rules" / "1.1"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    def write(name, text):
        (out / f"{name}.yaml").write_text(text)

    for column, (data_type, nullable, values) in COLUMNS.items():
        write(f"{column}_Required", f"column_id: {column}\ncheck:\n  column_required\n")
        write(f"{column}_Is{data_type.title().replace('-', '')}", f"column_id: {column}\ncheck:\n  data_type: {data_type}\n")
        write(f"{column}_{'Nullable' if nullable else 'NotNull'}",
              f"column_id: {column}\ncheck:\n  allow_nulls: {'true' if nullable else 'false'}\n")
        if values:
            listed = "".join(f'    - "{v}"\n' for v in values)
            write(f"{column}_Enum", f"column_id: {column}\ncheck:\n  value_in:\n{listed}")
    for name, (column, friendly, failing) in CONDITIONS.items():
        query = f"SELECT CASE WHEN {failing} THEN FALSE ELSE TRUE END AS check_output FROM df;"
        write(name, f'column_id: {column}\ncheck_friendly_name: "{friendly}"\ncheck:\n  sql_query: |\n    {query}\n')


if __name__ == "__main__":
    main()
